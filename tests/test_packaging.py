"""What an installed cramnas holds (issue 39 §1).

The packages open files by a path relative to themselves: the device profiles, search spaces and
run configs (search/base/paths.py, space/search_space.py) and the reference core (trainer/budget.py).
A non-editable install has only what the wheel carries, and pyproject.toml's package-data decides
that; the editable install of the edit loop reads the checkout, so it hides a gap (the wheel once
lacked search/profiles/, and an installed `search.run` could not start). Here the wheel that
`pip wheel .` builds from the checkout's files must carry every file of the five packages, and a
command run from the unpacked wheel, away from the checkout, must find what it opens. CI goes
further: it installs the wheel in a fresh venv and runs a one-trial study from a temporary
directory (.ci/run).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ROOT, cli_env

PACKAGES = ("space", "trainer", "glue", "search", "dashboards")  # pyproject.toml's packages.find

pytestmark = pytest.mark.slow  # building the wheel takes seconds


def checkout_files() -> list[str]:
    """The files a commit of this checkout holds: tracked, or new and not ignored."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, check=True, timeout=60).stdout.decode()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: its files are not known")
    return sorted(name for name in listed.split("\0") if name and (ROOT / name).is_file())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel built from a copy of the checkout's top-level files and packages: the build writes
    nothing into the checkout, and no build/ left there by an earlier build can lend it stale files."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    for name in (name for name in checkout_files() if "/" not in name or name.split("/")[0] in PACKAGES):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-q", "-w", str(tmp / "dist"), str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    [path] = (tmp / "dist").glob("cramnas-*.whl")
    return path


def test_the_wheel_carries_every_file_of_the_packages(wheel):
    with zipfile.ZipFile(wheel) as archive:
        carried = set(archive.namelist())
    package_files = [name for name in checkout_files() if name.split("/")[0] in PACKAGES]
    assert any(name.endswith(".yaml") for name in package_files)  # the data files are among them
    missing = [name for name in package_files if name not in carried]
    assert not missing, (f"the wheel lacks {', '.join(missing)}: add them to [tool.setuptools.package-data] in "
                         "pyproject.toml (a .py file: its folder needs an __init__.py)")


@pytest.mark.subprocess
def test_a_command_run_from_the_unpacked_wheel_finds_what_it_opens(wheel, tmp_path):
    installed = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(installed)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # The unpacked wheel comes first on the path, before the editable install's finder (appended to
    # sys.meta_path); the working directory is away from the checkout.
    env = cli_env(PYTHONPATH=str(installed), CRAMNAS_CACHE=str(tmp_path / "cache"))
    where = subprocess.run([sys.executable, "-c", "import search, space, trainer; "
                            "print(search.__file__, space.__file__, trainer.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    assert all(Path(path).is_relative_to(installed) for path in where.stdout.split()), where.stdout
    # The profile, its space and run config, and (for a refs budget) the reference core.
    done = subprocess.run([sys.executable, "-m", "search.run", "--profile", "cpu", "--trials", "1", "--budget", "180refs",
                           "--no-probe", "--estimate"], cwd=elsewhere, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("estimate: 1 trial, ") and "assumed: profile cpu.yaml" in done.stdout
    assert os.listdir(elsewhere) == []  # an estimate writes nothing
