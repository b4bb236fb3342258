"""Every flag of every command says what it does and, where it has one, its default; no command's
description is cut (issue 39 §6). trainer.console.CliParser does both for every command: its help
formatter appends a default the help does not name, and a docstring passed whole gives its first
paragraph."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest

from trainer.console import CliParser

REPO = Path(__file__).resolve().parent.parent


def test_help_shows_a_default_that_says_something_once():
    parser = CliParser(prog="demo", description="First sentence runs\nover two lines.\n\nSecond paragraph.")
    parser.add_argument("--trials", type=int, default=200, help="trials in the study")
    parser.add_argument("--budget", help="per-trial budget (default: the profile's)")
    parser.add_argument("--top", type=int, default=5, help="rows (default: %(default)s)")
    parser.add_argument("--fast", action="store_true", help="skip the probe")
    text = " ".join(parser.format_help().split())
    assert parser.description == "First sentence runs over two lines."
    assert "trials in the study (default: 200)" in text and "rows (default: 5)" in text
    assert "(default: None)" not in text and "(default: False)" not in text and text.count("default") == 3


@pytest.mark.slow  # imports every command's module: torch, transformers, mlflow
def test_every_flag_has_help_with_its_default_and_no_description_is_cut():
    spec = importlib.util.spec_from_file_location("gen_cli", REPO / "docs" / "gen_cli.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    problems = []
    for module, _ in gen.COMMANDS:
        parser = gen.parser_of(module)
        if not parser.description or not parser.description.rstrip().endswith((".", "?", ")")):
            problems.append(f"{module}: description {parser.description!r} is cut or missing")
        formatter = parser._get_formatter()
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            name = "/".join(action.option_strings) or action.dest
            if not action.help:
                problems.append(f"{module} {name}: no help")
                continue
            shown = formatter._expand_help(action)
            if action.default is not None and not isinstance(action.default, bool) and "default" not in shown.lower():
                problems.append(f"{module} {name}: its default {action.default!r} is not shown")
    assert not problems, "; ".join(problems)
