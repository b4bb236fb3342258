"""Safe defaults (issue 7 §3): servers on loopback unless told otherwise, YAML through `safe_load`
only, checkpoints never unpickled, and `search.export` writing inside the project unless `--force`.

Each default has a static check over the source tree (so that new code keeps it) and a behavioural
one (so that the code in place keeps it)."""

from __future__ import annotations

import ast
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import cli_env, free_port, tiny_checkpoint

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("space", "trainer", "glue", "search", "dashboards", "benchmarks")
LOOPBACK = "127.0.0.1"


def sources(*roots: str) -> list[Path]:
    files = [path for root in roots for path in (REPO / root).rglob("*.py")]
    assert files, roots
    return files


def calls(path: Path) -> list[ast.Call]:
    return [node for node in ast.walk(ast.parse(path.read_text(), str(path))) if isinstance(node, ast.Call)]


def dotted(node: ast.AST) -> str:
    """`yaml.load` for the callee `yaml.load`, `` for anything that is not a plain dotted name."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def keyword(call: ast.Call, name: str):
    """The literal value of keyword `name` (None when absent; `...` when not a literal)."""
    for item in call.keywords:
        if item.arg == name:
            return item.value.value if isinstance(item.value, ast.Constant) else ...
    return None


class Payload:
    """Unpickling this runs a shell command that creates `marker`: proof that something executed it."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def yaml_payload(marker: Path) -> str:
    return f'!!python/object/apply:os.system ["touch {marker}"]'


# ---- servers bind 127.0.0.1 ---------------------------------------------------------------------

def test_search_keeps_a_local_ray_on_loopback_and_a_cluster_user_free():
    from search import run

    saved = dict(os.environ)
    try:
        os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        assert run.main(["--trials", "0"]) == 2  # fails after the environment is set, before any work
        local = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
        os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        assert run.main(["--trials", "0", "--address", "10.1.2.3:6379"]) == 2
        cluster = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert local == "0"  # Ray's switch that puts the node and every port on 127.0.0.1 (docs/stack.md)
    assert cluster is None


def test_every_local_ray_start_has_no_dashboard_and_no_wider_host():
    starts = [(path, call) for path in sources(*PACKAGES) for call in calls(path) if dotted(call.func) == "ray.init"]
    assert any(path.name == "ray_executor.py" for path, _ in starts)  # search.run's (search.study.ray_executor)
    for path, call in starts:
        where = f"{path.relative_to(REPO)}:{call.lineno}"
        if keyword(call, "address") is None:  # starts a local Ray, rather than joining a cluster
            assert keyword(call, "include_dashboard") is False, f"{where}: a local Ray must not start its dashboard"
        assert keyword(call, "dashboard_host") in (None, LOOPBACK), where
        assert keyword(call, "_node_ip_address") in (None, LOOPBACK), where


def test_no_source_binds_every_interface():
    for path in sources(*PACKAGES):
        assert "0.0.0.0" not in path.read_text(), path.relative_to(REPO)


def test_the_readme_ui_commands_bind_loopback():
    """The README opens the UI with dashboards.ui (loopback by default: the next test); a bare
    `mlflow ui|server` command it shows passes --host 127.0.0.1, and nothing widens the host."""
    text = (REPO / "README.md").read_text()
    assert "python -m dashboards.ui" in text
    for line in text.splitlines():
        if re.search(r"\bmlflow (ui|server)\b", line):
            assert f"--host {LOOPBACK}" in line, line
        assert not re.search(r"--host (?!127\.0\.0\.1)", line), line


@pytest.mark.slow
def test_the_mlflow_ui_launcher_binds_loopback_by_default(tmp_path, monkeypatch):
    from dashboards import ui

    hosts = []

    def no_server(uri, port, host):
        hosts.append(host)
        raise KeyboardInterrupt  # ui.main's way out: Ctrl-C

    monkeypatch.setattr(ui, "serve", no_server)
    assert ui.main(["--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]) == 0
    assert hosts == [LOOPBACK]

    commands = []

    class Process:
        pid, returncode = 2**31 - 1, 0  # no such process: Server.stop's killpg finds nothing to signal

        def poll(self):
            return 0

    def popen(command, **kwargs):
        commands.append(command)
        return Process()

    (tmp_path / "mlflow.db").touch()  # ui.start refuses a store that does not exist
    monkeypatch.setattr(ui.subprocess, "Popen", popen)
    monkeypatch.setattr(ui, "_wait_healthy", lambda server, timeout_s: None)
    port = free_port()
    server = ui.start(f"sqlite:///{tmp_path}/mlflow.db", port=port)
    server.log_path.unlink()
    command = commands[0]
    assert command[command.index("--host") + 1] == LOOPBACK
    assert server.url == f"http://{LOOPBACK}:{port}"


# ---- YAML: safe_load only ------------------------------------------------------------------------

def test_yaml_is_only_ever_safe_loaded():
    unsafe = {"yaml.load", "yaml.load_all", "yaml.unsafe_load", "yaml.unsafe_load_all", "yaml.full_load",
              "yaml.full_load_all"}
    for path in sources(*PACKAGES, "tests"):
        for call in calls(path):
            where = f"{path.relative_to(REPO)}:{call.lineno}"
            assert dotted(call.func) not in unsafe, f"{where}: use yaml.safe_load"
            loader = next((item.value for item in call.keywords if item.arg == "Loader"), None)
            assert loader is None or dotted(loader) in ("yaml.SafeLoader", "yaml.CSafeLoader"), where


@pytest.mark.subprocess
def test_a_python_tag_in_a_space_file_is_refused_by_search_run_and_not_run(tmp_path):
    marker = tmp_path / "executed"
    space = tmp_path / "space.yaml"
    space.write_text(f"name: {yaml_payload(marker)}\nparams:\n  layers: {{int: [1, 2]}}\n")
    result = subprocess.run([sys.executable, "-m", "search.run", "--space", str(space), "--profile", "cpu"],
                            cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=120, check=False)
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(errors) == 1 and "space.yaml: line 1" in errors[0] and "python/object/apply" in errors[0], errors
    assert "remove the tag" in errors[0], errors
    assert not marker.exists()


def _run_config(path: Path, marker: Path) -> None:
    from trainer.config import load_run_config

    path.write_text(f"name: x\narch: {{layers: 2}}\ntrain: {{lr: {yaml_payload(marker)}}}\n")
    load_run_config(path)


def _profile(path: Path, marker: Path) -> None:
    from search.run import load_profile

    path.write_text(f"space: {yaml_payload(marker)}\n")
    load_profile(path)


def _checkpoint_arch(path: Path, marker: Path) -> None:
    from trainer.checkpoint import FILES, load_checkpoint

    path.mkdir()
    for name in FILES:
        (path / name).write_text("{}")
    (path / "arch.yaml").write_text(f"layers: {yaml_payload(marker)}\n")
    load_checkpoint(path)


@pytest.mark.parametrize("load", [_run_config, _profile, _checkpoint_arch], ids=["run config", "profile",
                                                                                 "checkpoint arch.yaml"])
def test_a_python_tag_in_any_yaml_is_a_one_line_error_and_not_run(load, tmp_path):
    marker = tmp_path / "executed"
    with pytest.raises(ValueError) as caught:  # ConfigError, UsageError: the CLIs print them as one line
        load(tmp_path / "input", marker)
    assert "\n" not in str(caught.value) and "input" in str(caught.value), caught.value
    assert not marker.exists()


# ---- checkpoints: safetensors, never pickle --------------------------------------------------------

def test_no_source_unpickles_a_file():
    unpicklers = {"pickle.load", "pickle.loads", "pickle.Unpickler", "dill.load", "dill.loads", "cloudpickle.load",
                  "cloudpickle.loads", "joblib.load", "torch.jit.load", "pd.read_pickle", "pandas.read_pickle"}
    for path in sources(*PACKAGES):
        for call in calls(path):
            name, where = dotted(call.func), f"{path.relative_to(REPO)}:{call.lineno}"
            assert name not in unpicklers, f"{where}: {name} runs code from the file"
            if name == "torch.load":
                assert keyword(call, "weights_only") is True, f"{where}: torch.load needs weights_only=True"
            if name in ("np.load", "numpy.load"):
                assert keyword(call, "allow_pickle") in (None, False), where


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    return tiny_checkpoint(tmp_path)


@pytest.mark.parametrize("weights", ["model.bin", "model.safetensors"])
def test_a_pickled_checkpoint_is_refused_and_not_run(weights, checkpoint, tmp_path):
    from trainer.checkpoint import load_checkpoint
    from trainer.config import ConfigError

    load_checkpoint(checkpoint)  # the untouched checkpoint loads
    marker = tmp_path / "executed"
    (checkpoint / "model.safetensors").unlink()
    (checkpoint / weights).write_bytes(pickle.dumps(Payload(marker)))
    with pytest.raises(ConfigError) as caught:
        load_checkpoint(checkpoint)
    assert "model.safetensors" in str(caught.value) and "\n" not in str(caught.value)
    assert not marker.exists()


# ---- search.export writes inside the project unless --force ----------------------------------------

@pytest.mark.slow
def test_export_refuses_to_write_outside_the_project_without_force(tmp_path, capsys):
    import mlflow
    import optuna

    from search.export import PROJECT, main
    from space.arch import ArchConfig
    from trainer.config import TrainConfig, load_run_config

    storage = f"sqlite:///{tmp_path}/optuna.db"
    study = optuna.create_study(study_name="s", storage=storage)
    study.set_user_attr("train", TrainConfig().to_dict())
    study.set_user_attr("objective", "mlm")
    trial = study.ask()
    trial.set_user_attr("arch", ArchConfig(layers=2, hidden=64, heads=2).to_dict())
    trial.set_user_attr("metrics", {"validation_loss": 3.5})
    study.tell(trial, 3.5)
    tracking = f"sqlite:///{tmp_path}/mlflow.db"
    mlflow.MlflowClient(tracking).create_experiment("s")  # as search.run leaves it, without the trial runs
    common = ["--study", "s", "--storage", storage, "--tracking-uri", tracking]

    capsys.readouterr()  # Optuna's and MLflow's set-up logs
    outside = tmp_path / "best.yaml"
    escaping = PROJECT / "trainer" / "configs" / os.path.relpath(outside, PROJECT / "trainer" / "configs")
    for out in (outside, escaping):
        assert main([*common, "--out", str(out)]) == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith("error: --out:") and "outside the project" in error and "--force" in error, error
        assert "\n" not in error and not outside.exists()

    assert main([*common, "--out", str(outside), "--force"]) == 0  # the refusal was the only obstacle
    assert load_run_config(outside).arch.hidden == 64
