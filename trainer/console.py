"""What every cramnas command shares on the console: usage errors in one line, Ctrl-C in one line,
third-party libraries kept quiet, and progress that suits a terminal or a log file.

It lives in trainer/ so that every layer's commands (trainer, glue, search, dashboards) use the
same one: a layer imports only those below it.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import logging
import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, TextIO

VERBOSE_HELP = "let the libraries underneath (Ray, MLflow, Optuna, datasets) print their own progress and logs"

# Read by each library when it is imported, and inherited by the processes a command starts (Ray's
# trial workers): progress bars and INFO lines that would interleave with the command's own.
QUIET_ENVIRONMENT = {
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",  # "Generating train split" bars
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # hub downloads; transformers' loading bars follow it
    "DATASETS_VERBOSITY": "error",
    "TRANSFORMERS_VERBOSITY": "error",
    "MLFLOW_LOGGING_LEVEL": "WARNING",  # "Creating initial MLflow database tables..."
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",  # a bar per small uploaded file
}
# The same libraries' loggers, for a library imported before `quiet_libraries` ran (the
# environment is read at import), and those configured in code only: Optuna's "A new study
# created", Ray's "Started a local Ray instance" and Tune's "Wrote the latest version of all
# result files". Child loggers: Ray and Optuna reset their root logger's level when imported.
QUIET_LOGGERS = {"mlflow": logging.WARNING, "alembic": logging.WARNING, "datasets": logging.ERROR,
                 "transformers": logging.ERROR, "huggingface_hub": logging.ERROR,
                 "optuna.study": logging.WARNING, "optuna.storages": logging.WARNING,
                 "ray._private": logging.WARNING, "ray.tune": logging.WARNING, "ray.train": logging.WARNING,
                 "ray.air": logging.WARNING}


def is_terminal(stream: TextIO | None = None) -> bool:
    """Whether `stream` (default stdout) is a terminal: a live view and progress bars there, plain
    lines in a log file or a pipe."""
    stream = sys.stdout if stream is None else stream
    return bool(getattr(stream, "isatty", None) and stream.isatty())


def quiet_libraries(verbose: bool = False) -> None:
    """Silence the libraries underneath (their INFO logs and progress bars) unless `verbose`
    (`--verbose`): a command's own lines are the ones a user reads. Call it first in `main`."""
    if verbose:
        return
    for name, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    for name, level in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(level)
    if "datasets" in sys.modules:  # imported already: it read the environment too early
        sys.modules["datasets"].disable_progress_bars()
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].utils.disable_progress_bars()


def choice_error(value: Any, choices: Iterable[Any]) -> str:
    """`'tpee' is not one of evolution, random, tpe; did you mean tpe?`"""
    names = [str(choice) for choice in choices]
    close = difflib.get_close_matches(str(value), names, n=1)
    return f"{value!r} is not one of {', '.join(names)}" + (f"; did you mean {close[0]}?" if close else "")


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's help with each flag's default at the end of its help, where the default says
    something: not None (the help says what happens without the flag), not a switch's False or
    True, and not where the help already names its default in words."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or isinstance(action.default, bool) or "default" in (action.help or "").lower():
            return action.help
        return super()._get_help_string(action)


class CliParser(argparse.ArgumentParser):
    """argparse with every usage error as one `error:` line and exit 2, as for every other bad
    input: no usage block above it, and a suggestion for a mistyped choice or flag. `--help` shows
    each flag's default (DefaultsHelpFormatter), and the description is the first paragraph of
    what is given, whole: a module passes its docstring, and no sentence is cut at a line's end."""

    def __init__(self, *args: Any, description: str | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        if description is not None:
            description = " ".join(description.strip().split("\n\n")[0].split())
        super().__init__(*args, description=description, **kwargs)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is not None and value not in action.choices:
            raise argparse.ArgumentError(action, choice_error(value, action.choices))

    def error(self, message: str) -> None:  # type: ignore[override]
        message = message.removeprefix("argument ")  # "argument --trials: ..." -> "--trials: ..."
        if message.startswith("unrecognized arguments: "):
            flags = [option for action in self._actions for option in action.option_strings]
            unknown = message.removeprefix("unrecognized arguments: ").split()
            close = next((match for word in unknown if word.startswith("-")
                          for match in difflib.get_close_matches(word.split("=")[0], flags, n=1)), None)
            if close:
                message += f"; did you mean {close}?"
        self.exit(2, f"error: {message}\n")


def one_line_on_ctrl_c(main: Callable[..., int]) -> Callable[..., int]:
    """A command's `main` that answers Ctrl-C with one line and exit status 130 (128 + SIGINT, as a
    shell reports it), not a traceback. Commands that clean up on Ctrl-C themselves (a study marks
    its runs, a cram writes a checkpoint) still do: this catches only what they let through."""

    @functools.wraps(main)
    def wrapper(*args: Any, **kwargs: Any) -> int:
        try:
            return main(*args, **kwargs)
        except KeyboardInterrupt:
            print("interrupted (Ctrl-C)", file=sys.stderr)
            return 130

    return wrapper


def duration(seconds: float) -> str:
    """`42 s`, `3.5 min` or `2.1 h`: an elapsed time or ETA in a progress line."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def eta(elapsed_s: float, done: float, total: float) -> str:
    """The time left if the rest goes as fast as what is done: `ETA 3.5 min`, or `ETA ?` before
    anything is done."""
    if done <= 0:
        return "ETA ?"
    return f"ETA {duration(elapsed_s / done * max(total - done, 0))}"


class ProgressLines:
    """Progress for a log file: a plain line each time another `every_percent` is done, or after
    `every_s` seconds without one, where a terminal gets a progress bar (whose carriage-return
    updates would be one endless line in a file)."""

    def __init__(self, write: Callable[[str], None], every_percent: int = 10, every_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic):
        self.write, self.every_percent, self.every_s, self.clock = write, every_percent, every_s, clock
        self.started = self.last_line = clock()
        self.step = 0  # multiples of every_percent reported so far

    def update(self, fraction: float, detail: str = "") -> None:
        now = self.clock()
        step = int(100 * fraction) // self.every_percent
        if step <= self.step and now - self.last_line < self.every_s:
            return
        self.step, self.last_line = max(step, self.step), now
        elapsed = now - self.started
        self.write(f"{100 * fraction:3.0f}%  {duration(elapsed)} elapsed, {eta(elapsed, fraction, 1.0)}"
                   + (f"  {detail}" if detail else ""))


def count(number: int, noun: str) -> str:
    """`1 trial`, `8 trials`: a number with its noun in the right number (nouns with a plain -s plural)."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def floor_gap(nats_below: float, decimals: int = 3, unit: str = " nats") -> str:
    """A loss against a reference loss (`nats_below` = reference - loss) in words whose sign agrees
    with them: `0.481 nats below` the reference or `0.050 nats above` it."""
    return f"{abs(nats_below):.{decimals}f}{unit} {'below' if nats_below >= 0 else 'above'}"
