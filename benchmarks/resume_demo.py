"""A cram killed at a random moment and resumed ends where an uninterrupted one does.

    CRAMNAS_CACHE=/tmp/cramnas-cache python benchmarks/resume_demo.py --data ../shared/data [--budget 4e12flops] [--seeds 3]

For each seed, `python -m trainer.cram` runs crammed-bert-cpu twice under the same budget: once
uninterrupted, once with resumable checkpoints (`--checkpoint-every`), SIGKILLed (no chance to
save) at a moment drawn uniformly from 35-85% of the uninterrupted run's wall time, then
`--resume`d to the end. Printed per seed: the kill time, tokens, validation loss of both runs and
the largest weight difference; then the spread of the uninterrupted runs' losses over the seeds
(the seed noise a resumed run must stay within). Token and FLOP budgets resume exactly; wall-clock
budgets, whose steps depend on the machine's speed, do not.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from safetensors.torch import load_file

CONFIG = Path(__file__).resolve().parents[1] / "trainer" / "configs" / "crammed-bert-cpu.yaml"


def cram(args: argparse.Namespace, out: Path, seed: int, *extra: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "trainer.cram", "--config", str(CONFIG), "--budget", args.budget,
               "--data", args.data, "--seed", str(seed), "--out", str(out), "--validate-every", "off", *extra]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finished(process: subprocess.Popen) -> None:
    _, errors = process.communicate()
    if process.returncode != 0:
        raise SystemExit(f"error: trainer.cram exited {process.returncode}: {errors.strip().splitlines()[-1:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--budget", default="4e12flops", help="a token or FLOP budget (exact resume)")
    parser.add_argument("--checkpoint-every", default="5e11flops")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(0)
    rows, losses = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for seed in range(args.seeds):
            whole, killed = Path(scratch) / f"whole-{seed}", Path(scratch) / f"killed-{seed}"
            started = time.perf_counter()
            finished(cram(args, whole, seed, "--checkpoint-every", "off"))
            wall = time.perf_counter() - started
            process = cram(args, killed, seed, "--checkpoint-every", args.checkpoint_every)
            kill_at = rng.uniform(0.35, 0.85) * wall
            time.sleep(kill_at)
            os.kill(process.pid, signal.SIGKILL)
            process.wait()
            finished(subprocess.Popen([sys.executable, "-m", "trainer.cram", "--resume", str(killed)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
            results = [json.loads((run / "result.json").read_text()) for run in (whole, killed)]
            weights = [load_file(run / "model.safetensors") for run in (whole, killed)]
            difference = max(float((weights[0][k] - weights[1][k]).abs().max()) for k in weights[0])
            losses.append(results[0]["validation_loss"])
            rows.append(f"| {seed} | {kill_at:.0f} s of {wall:.0f} s | {results[0]['tokens']:,} / {results[1]['tokens']:,} | "
                        f"{results[0]['validation_loss']:.4f} / {results[1]['validation_loss']:.4f} | {difference:.1e} |")
            print(rows[-1], flush=True)
    print("\n| seed | killed at | tokens (uninterrupted / resumed) | validation loss (uninterrupted / resumed) "
          "| largest weight difference |\n|---|---|---|---|---|\n" + "\n".join(rows))
    spread = statistics.stdev(losses) if len(losses) > 1 else float("nan")
    print(f"\nseed noise of the uninterrupted runs: validation loss {statistics.mean(losses):.4f} ± {spread:.4f} (std)")


if __name__ == "__main__":
    main()
