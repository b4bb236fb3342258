"""GLUE evaluation of a checkpoint, as Cramming evaluates (GLUE_sane), or as a quick probe.

    python -m glue.evaluate --checkpoint runs/crammed-bert-cpu-60s --protocol probe --tasks available \
        --data ../shared/data
    python -m glue.evaluate --checkpoint runs/crammed-bert-24h --tasks all --protocol sane --seeds 5

Protocols:
- `sane`: Cramming's GLUE_sane: every task fine-tuned for 5 epochs on its whole train split, batch
  16, lr 4e-5, cosine schedule with 10% warmup, AdamW (0.9, 0.98), eps 1e-6, no weight decay,
  max length 128, dropout 0.1; each metric is the median over `--seeds` fine-tuning runs (5).
- `probe`: the capped fine-tuning of a search trial (glue.probe; defaults in `ProbeLimits`).

`--tasks`: `all` (the 8 tasks), `available` (those with train and validation under --data; every
task from the hub), or a list such as `rte,sst2`. Default: all for sane, the probe tasks for probe.
Prints a table of every metric (x 100) and the average over the entries run, and writes
`glue.json` into the checkpoint directory. Bad input exits with status 2 and one `error:` line,
before any fine-tuning.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from glue.data import why_unavailable
from glue.finetune import SANE
from glue.runner import DEFAULT_PROBE_TASKS, ProbeLimits, ProbeResult, run_glue
from glue.tasks import TASKS, GlueError, get_task
from space.errors import CramnasError
from trainer.console import VERBOSE_HELP, CliParser, one_line_on_ctrl_c, quiet_libraries
from trainer.data_flags import add_data_arguments

RESULT_FILE = "glue.json"


def evaluate(checkpoint: str | os.PathLike, tasks: str | Iterable[str] = "all", seeds: int = 5,
             data_dir: str | os.PathLike | None = None, report: Callable[[str], None] | None = None) -> ProbeResult:
    """Cramming's GLUE_sane on a checkpoint: medians over `seeds` fine-tuning runs per task."""
    return run_glue(checkpoint, None, tasks, SANE, range(seeds), "sane", data_dir, report)


def result_table(result: ProbeResult, title: str):
    from rich.table import Table

    table = Table(title=title)
    table.add_column("task")
    table.add_column("metric")
    table.add_column("score", justify="right")
    for task_name in result.tasks:
        task = get_task(task_name)
        for entry, _ in task.entries:
            for name in task.metrics:
                main = " (main)" if name == task.main_metric and len(task.metrics) > 1 else ""
                table.add_row(entry, name + main, f"{100 * result.metrics[entry][name]:.1f}")
    table.add_section()
    table.add_row("average", f"{len(result.scores)} entries", f"{100 * result.average:.1f}", style="bold")
    return table


def build_parser() -> CliParser:
    """The command line of `python -m glue.evaluate` (docs/cli.md is generated from it: docs/gen_cli.py)."""
    parser = CliParser(prog="python -m glue.evaluate", description=__doc__)
    parser.add_argument("--checkpoint", required=True, help="a checkpoint directory written by trainer.cram")
    parser.add_argument("--tasks", help=f"all, available, or a comma list of {','.join(TASKS)}")
    parser.add_argument("--protocol", choices=("sane", "probe"), default="sane",
                        help="sane: Cramming's GLUE_sane, full fine-tuning; probe: a search trial's capped one")
    parser.add_argument("--seeds", type=int, help="fine-tuning seeds per task; the median is reported "
                                                  "(default 5 for sane, 1 for probe)")
    # No --corpus: nothing is pretrained here. No --cache-dir: GLUE tasks are read directly, not packed.
    add_data_arguments(parser, corpus=False, cache_dir=False,
                       data_help="local data directory holding glue/<task>/*.parquet (default: the hub)")
    parser.add_argument("--max-train-examples", type=int, default=ProbeLimits.max_train_examples,
                        help="probe only: training examples per task")
    parser.add_argument("--max-seconds-per-task", type=float, default=ProbeLimits.max_seconds_per_task,
                        help="probe only: training wall-clock per task")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    return parser


@one_line_on_ctrl_c
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_libraries(args.verbose)

    from rich.console import Console

    console = Console()

    def say(text: str) -> None:  # one unwrapped line, whatever the terminal width: paths stay whole
        console.print(text, soft_wrap=True, markup=False, highlight=False)

    checkpoint = Path(args.checkpoint)
    tasks = args.tasks or ("all" if args.protocol == "sane" else ",".join(DEFAULT_PROBE_TASKS))
    try:  # every user error surfaces here, before the first fine-tuning step
        if args.seeds is not None and args.seeds < 1:
            raise GlueError(f"--seeds: must be at least 1, got {args.seeds}")
        for flag, field, value in (("--max-train-examples", "max_train_examples", args.max_train_examples),
                                   ("--max-seconds-per-task", "max_seconds_per_task", args.max_seconds_per_task)):
            if value <= 0:
                raise GlueError(f"{flag}: {field} must be positive, got {value:g}; it caps the probe's fine-tuning "
                                "per task")
        if not checkpoint.is_dir():
            raise GlueError(f"checkpoint {checkpoint} is not a directory; pass one written by trainer.cram --out")
        if not os.access(checkpoint, os.W_OK):
            raise GlueError(f"cannot write {checkpoint / RESULT_FILE}; make the checkpoint directory writable")
        if args.data is not None and tasks.strip().lower() == "available":
            for task in TASKS.values():
                reason = why_unavailable(task, args.data)
                if reason is not None:
                    say(f"skipping {task.name}: {reason}")
        if args.protocol == "sane":
            result = evaluate(checkpoint, tasks, 5 if args.seeds is None else args.seeds, args.data, report=say)
        else:
            limits = ProbeLimits(max_train_examples=args.max_train_examples,
                                 max_seconds_per_task=args.max_seconds_per_task, data_dir=args.data)
            seeds = [limits.seed] if args.seeds is None else range(args.seeds)
            result = run_glue(checkpoint, None, tasks, limits.settings(), seeds, "probe", args.data, say)
    except CramnasError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    console.print(result_table(result, f"GLUE ({result.protocol}) of {checkpoint}"))
    say(result.average_over)
    say(f"{result.seconds['total']:.1f} s on {result.device}")
    out = checkpoint / RESULT_FILE
    record = {"checkpoint": str(checkpoint), **result.to_dict()}
    out.write_text(json.dumps(record, indent=2))
    say(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
