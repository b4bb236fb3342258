"""docs/cli.md, the command-line reference, against the commands' own parsers (docs/gen_cli.py):
every flag of every command is on the page, in its command's section, the page is what the
generator writes today, and every command of the packages is in the generator's list."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGE = REPO / "docs" / "cli.md"
PACKAGES = ("space", "trainer", "glue", "search", "dashboards")


def generator():
    spec = importlib.util.spec_from_file_location("gen_cli", REPO / "docs" / "gen_cli.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sections(text: str) -> dict[str, str]:
    """docs/cli.md's `## <command>` sections, by command."""
    parts = re.split(r"^## (\S+)\n", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_command_of_the_packages_is_in_the_reference():
    """A module that builds a CliParser is a command: it exposes build_parser() and gen_cli lists it
    (no import needed to know, so this runs in the edit loop)."""
    listed = {module for module, _ in generator().COMMANDS}
    commands = set()
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if re.search(r"\bCliParser\(\s*(\n\s*)?prog=", text):
                module = ".".join(path.relative_to(REPO).with_suffix("").parts)
                commands.add(module)
                assert re.search(r"^def build_parser\(\)", text, flags=re.MULTILINE), \
                    f"{module} builds a CliParser but has no build_parser(): docs/gen_cli.py cannot read it"
    assert commands == listed, ("commands missing from docs/gen_cli.py COMMANDS: "
                                f"{sorted(commands - listed)}; listed but not commands: {sorted(listed - commands)}")
    page = sections(PAGE.read_text(encoding="utf-8"))
    assert len(page) == len(listed), f"docs/cli.md has {len(page)} command sections, gen_cli lists {len(listed)}"


@pytest.mark.slow  # imports every command's module: torch, transformers, mlflow
def test_every_flag_of_every_command_is_in_its_section():
    gen = generator()
    page = sections(PAGE.read_text(encoding="utf-8"))
    missing = []
    for module, _ in gen.COMMANDS:
        parser = gen.parser_of(module)
        name = parser.prog.removeprefix("python -m ")
        body = page.get(name)
        if body is None:
            missing.append(f"{name}: no section '## {name}'")
            continue
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.help is argparse.SUPPRESS:
                continue
            for flag in action.option_strings or [str(action.metavar or action.dest)]:
                if not re.search(rf"^- \*\*`{re.escape(flag)}[ `,]", body, flags=re.MULTILINE):
                    missing.append(f"{name} {flag}")
    assert not missing, f"docs/cli.md lacks {', '.join(missing)}: run python docs/gen_cli.py"


@pytest.mark.slow
def test_the_reference_is_what_the_parsers_say_today():
    gen = generator()
    assert PAGE.read_text(encoding="utf-8") == gen.render(), \
        "docs/cli.md is stale (a flag, its help or default changed): run python docs/gen_cli.py"


def test_every_flag_the_readme_and_the_docs_show_is_one_their_command_takes():
    """A command as README.md or a docs page shows it (`python -m search.run ... --flag`) uses only
    flags of that command: checked against the reference, which the tests above check against the
    parsers (so this needs no import and runs in the edit loop)."""
    page = sections(PAGE.read_text(encoding="utf-8"))
    wrong = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        if path == PAGE:
            continue
        text = re.sub(r"\\\n\s*", " ", path.read_text(encoding="utf-8"))  # a command continued with a backslash
        commands = (found for part in re.split(r"&&|;|\n", text)  # one command a part
                    for found in re.findall(r"python -m ([\w.]+)((?:[ \t]+[^\s#|`]+)*)", part))
        for command, rest in commands:
            if command not in page:  # pip, pytest, ...: not ours
                continue
            for flag in re.findall(r"(?<!\S)(--[\w-]+)", rest):
                if not re.search(rf"`{re.escape(flag)}[ `,=]", page[command]):
                    wrong.append(f"{path.relative_to(REPO)}: python -m {command} {flag}")
    assert not wrong, f"flags their command does not take: {wrong}"
