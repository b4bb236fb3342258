"""`python -m trainer.reference_core`: measure the reference core of `180refs` budgets
(trainer/budget.py): seconds per token of ~10 architectures spanning the CPU profile's space, on
ONE thread, and the fit

    seconds/token = a x matmul FLOPs/token + b x elementwise FLOPs/token + c x layers + d

(non-negative, scipy.optimize.nnls, on relative errors so the small models weigh as much as the
large). Prints the coefficients, each architecture's measured and predicted speed and the largest
relative error; `--write` stores them in trainer/reference_core.yaml (package data, read by every
refs budget) with the CPU, date and measurements they came from.

    python -m trainer.reference_core                        # measure and fit, print
    python -m trainer.reference_core --write                # ... and write trainer/reference_core.yaml
    python -m trainer.reference_core --archs 2 --steps 2 --repeats 1     # smoke run

Each timed step is the training loop's: `trainer.loop.mlm_backward` on a micro-batch of 32 rows of
64 random tokens (vocab 2048, 25% predicted), gradient clipping, a fused AdamW step. Architectures
take turns within each repeat, each repeat starting at the next one, so a change in the machine's
load hits them alike; the median over repeats is kept. Run it on an idle machine: a loaded core
makes every model slower, and not by the same factor.
"""

from __future__ import annotations

import argparse
import datetime
import math
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import yaml
from scipy.optimize import nnls

from space.arch import ArchConfig
from trainer.budget import REFERENCE_CORE, ReferenceCore
from trainer.config import load_run_config
from trainer.console import CliParser, one_line_on_ctrl_c
from trainer.loop import build_optimizer, mlm_backward
from trainer.model import CrammedBert

RUN_CONFIG = Path(__file__).with_name("configs") / "crammed-bert-cpu.yaml"
SPECIALS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}  # ids below 5: never drawn as tokens

# The CPU profile's fixed fields (space/spaces/crammed_bert_cpu.yaml) and the rest at their defaults.
BASE = ArchConfig(layers=1, hidden=64, heads=2, vocab_size=2048, max_seq_len=64)
# Spanning the CPU space: 1-4 layers x 64-192 wide, every ffn kind, both norms, every placement
# and position. crammed-bert-cpu and the proving ground's 1x64 winners come first, so that a short
# run (--archs 8) still holds the two ends the budget must be fair between.
ARCHITECTURES = [
    dict(layers=2, hidden=128, ffn_mult=3.0, ffn_kind="geglu", position="scaled_sinusoidal"),  # crammed-bert-cpu
    dict(ffn_kind="gelu", position="rotary"),  # the proving ground's winner
    dict(ffn_kind="swiglu", position="rotary", ffn_mult=2.0),
    dict(ffn_kind="relu", norm_placement="sandwich", norm_kind="rmsnorm", position="learned"),
    dict(layers=4, hidden=64, heads=4, ffn_kind="relu2", position="none", qkv_bias=True, ffn_bias=True),
    dict(layers=3, hidden=128, heads=4, ffn_kind="silu", norm_placement="sandwich", position="rotary"),
    dict(layers=2, hidden=192, heads=4, ffn_mult=4.0, ffn_kind="gelu", norm_placement="post", final_norm=False,
         position="learned", head_transform=True),
    dict(layers=4, hidden=192, heads=4, ffn_mult=2.0, ffn_kind="swiglu", norm_kind="rmsnorm", position="rotary"),
    dict(layers=2, hidden=64, ffn_kind="geglu", norm_placement="post", final_norm=False, position="alibi"),
    dict(layers=4, hidden=128, heads=2, ffn_mult=2.5, ffn_kind="reglu", position="scaled_sinusoidal"),
    dict(layers=1, hidden=192, heads=2, ffn_kind="gelu", position="sinusoidal", tie_embeddings=False),
]


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def fit(features: list[tuple[float, ...]], seconds: list[float]) -> tuple[list[float], list[float]]:
    """Non-negative coefficients of `features` (one row per architecture) that predict `seconds`
    with the least squared *relative* error; returns (coefficients, predictions). Each row is
    divided by its measurement (relative errors) and each column by its largest value, so that
    nnls sees numbers of one size (FLOPs are ~1e6, the constant 1)."""
    rows = np.asarray(features, dtype=float) / np.asarray(seconds, dtype=float)[:, None]
    scale = rows.max(axis=0)
    scale[scale == 0] = 1.0
    solution, _ = nnls(rows / scale, np.ones(len(seconds)))
    coefficients = (solution / scale).tolist()
    predictions = (np.asarray(features, dtype=float) @ np.asarray(coefficients)).tolist()
    return coefficients, predictions


def measure(archs: list[ArchConfig], steps: int, repeats: int, warmup: int) -> list[float]:
    """Median seconds per token of each architecture's training step, on one thread."""
    torch.set_num_threads(1)
    train = load_run_config(RUN_CONFIG).train
    device = torch.device("cpu")
    generator = torch.Generator().manual_seed(0)
    data = SimpleNamespace(special_ids=SPECIALS, vocab_size=BASE.vocab_size)  # what mlm_backward reads of the data
    models, optimizers = [], []
    for arch in archs:
        torch.manual_seed(0)
        models.append(CrammedBert(arch))
        optimizers.append(build_optimizer(models[-1], train, device))
    rows = torch.randint(5, BASE.vocab_size, (train.micro_batch, BASE.max_seq_len), generator=generator)

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        float(mlm_backward(model, rows, data, train.mlm_rate, device, generator))
        torch.nn.utils.clip_grad_norm_(model.parameters(), train.gradient_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for model, optimizer in zip(models, optimizers):
        for _ in range(warmup):
            step(model, optimizer)
    timings: list[list[float]] = [[] for _ in archs]
    for repeat in range(repeats):
        # Each repeat starts at another architecture, so a burst of load does not always hit the same one.
        for index in (np.arange(len(archs)) + repeat) % len(archs):
            model, optimizer = models[index], optimizers[index]
            start = time.perf_counter()
            for _ in range(steps):
                step(model, optimizer)
            timings[index].append((time.perf_counter() - start) / (steps * rows.numel()))
    return [statistics.median(t) for t in timings]


def report(archs: list[ArchConfig], features: list[tuple[float, ...]], seconds: list[float],
           coefficients: list[float], predictions: list[float], mlm_rate: float) -> list[dict]:
    """Print the fit and return its per-architecture rows (for the YAML)."""
    print("coefficients (seconds per unit): " + ", ".join(
        f"{name} {value:.4g}" for name, value in zip(ReferenceCore.FEATURES, coefficients)))
    base_flops, base_seconds = features[0][0], seconds[0]
    print(f"{'architecture':<40} {'us/token':>9} {'predicted':>9} {'error':>7} {'GFLOP/s':>8} {'elem/mm':>8}  "
          f"tokens vs {archs[0].describe().split()[0]} under equal FLOPs, equal seconds")
    rows = []
    for arch, feature, measured, predicted in zip(archs, features, seconds, predictions):
        error = predicted / measured - 1
        # Tokens relative to the first architecture under a FLOP budget / under equal seconds.
        flop_ratio, clock_ratio = base_flops / feature[0], base_seconds / measured
        print(f"{arch.describe():<40} {measured * 1e6:>9.2f} {predicted * 1e6:>9.2f} {error:>+7.1%} "
              f"{feature[0] / measured / 1e9:>8.1f} {feature[1] / feature[0]:>8.1%}  "
              f"{flop_ratio:.2f}x, {clock_ratio:.2f}x")
        changed = {k: v for k, v in arch.to_dict().items() if v != getattr(BASE, k)}
        rows.append({"arch": arch.describe(), "fields": changed, "measured_us_per_token": round(measured * 1e6, 4),
                     "predicted_us_per_token": round(predicted * 1e6, 4), "relative_error": round(error, 4)})
    worst = max(abs(row["relative_error"]) for row in rows)
    print(f"max relative error {worst:.1%} over {len(rows)} architectures (mlm_rate {mlm_rate})")
    return rows


def write(path: Path, coefficients: list[float], rows: list[dict], args: argparse.Namespace, mlm_rate: float) -> None:
    """The fit as trainer/reference_core.yaml reads it (ReferenceCore.load), with what it came from."""
    record = {
        "cpu": cpu_model(), "date": datetime.date.today().isoformat(), "threads": 1,
        "torch": str(torch.__version__), "seq_len": BASE.max_seq_len, "vocab_size": BASE.vocab_size,
        "micro_batch": load_run_config(RUN_CONFIG).train.micro_batch, "mlm_rate": mlm_rate,
        "steps": args.steps, "repeats": args.repeats,
        "base": f"each architecture's fields are those of {BASE.describe()} (vocab {BASE.vocab_size}, seq "
                f"{BASE.max_seq_len}, ArchConfig's defaults otherwise) but the ones listed",
        "coefficients": dict(zip(ReferenceCore.FEATURES, (float(f"{c:.6g}") for c in coefficients))),
        "max_relative_error": max(abs(row["relative_error"]) for row in rows),
        "architectures": rows,
    }
    if args.provisional:
        record = {"provisional": args.provisional, **record}
    header = ("# The reference core of `refs` budgets (trainer/budget.py): seconds per token = sum of\n"
              "# coefficient x feature (matmul FLOPs, elementwise FLOPs, layers, 1 per token), fitted by\n"
              "# `python -m trainer.reference_core` on the architectures below. Written by that command: re-run\n"
              "# it (--write) rather than editing. Changing these changes what every refs budget means.\n")
    path.write_text(header + yaml.safe_dump(record, sort_keys=False, width=120))
    print(f"wrote {path}")


def build_parser() -> CliParser:
    """The command line of `python -m trainer.reference_core` (docs/cli.md is generated from it: docs/gen_cli.py)."""
    parser = CliParser(prog="python -m trainer.reference_core",
                       description="Measure one CPU core's seconds per token on architectures spanning the CPU space "
                                   "and fit the reference core of refs budgets; run it on an idle machine.")
    parser.add_argument("--archs", type=int, default=len(ARCHITECTURES), help="the first N architectures")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per architecture and repeat")
    parser.add_argument("--repeats", type=int, default=5, help="repeats; the median is kept")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per architecture first")
    # The path the package reads, named as in a checkout: the help (and docs/cli.md) is the same on every machine.
    parser.add_argument("--write", nargs="?", const=str(REFERENCE_CORE), metavar="PATH",
                        help="write the fit to PATH (without one: the package's trainer/reference_core.yaml, "
                             "which every refs budget reads)")
    parser.add_argument("--provisional", help="a note stored as `provisional:` (e.g. 'measured under load')")
    return parser


@one_line_on_ctrl_c
def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 2 <= args.archs <= len(ARCHITECTURES):
        parser.error(f"--archs: between 2 and {len(ARCHITECTURES)}, got {args.archs}")
    if min(args.steps, args.repeats) < 1 or args.warmup < 0:
        parser.error("--steps and --repeats: at least 1; --warmup: at least 0")
    mlm_rate = load_run_config(RUN_CONFIG).train.mlm_rate
    archs = [BASE.replace(**changes) for changes in ARCHITECTURES[:args.archs]]
    features = [ReferenceCore.features(arch, mlm_rate) for arch in archs]
    seconds = measure(archs, args.steps, args.repeats, args.warmup)
    coefficients, predictions = fit(features, seconds)
    rows = report(archs, features, seconds, coefficients, predictions, mlm_rate)
    if not all(math.isfinite(c) for c in coefficients) or coefficients[0] <= 0:
        print("error: the fit has no positive matmul coefficient; measure more architectures or steps", file=sys.stderr)
        return 1
    if args.write:
        write(Path(args.write), coefficients, rows, args, mlm_rate)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
