"""Does the GLUE probe tell a pretrained encoder from an untrained one?

    CRAMNAS_CACHE=/tmp/cramnas-cache python benchmarks/probe_signal.py --data ../shared/data [--budget 5m]

Crams `crammed-bert-cpu` (4 layers, 256 wide, vocab 8192; `--config` for another) for the budget,
or takes `--checkpoint`, then probes it and the same architecture at random initialisation, each
with 3 probe seeds (the random encoder also draws a new initialisation per seed), with the default
probe (glue.probe, ProbeLimits()) unless overridden. Prints every run, then a markdown table of
mean +- std per entry and for the average, with the difference pretrained - random; the last line
is the wall time of the probes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import torch

from glue import DEFAULT_PROBE_TASKS, ProbeLimits, probe
from search.analysis.stats import plus_minus
from trainer.budget import Budget
from trainer.checkpoint import load_checkpoint
from trainer.config import load_run_config
from trainer.corpus import CorpusSource
from trainer.cram import cram
from trainer.data import prepare_data
from trainer.model import CrammedBert

CONFIG = Path(__file__).resolve().parents[1] / "trainer" / "configs" / "crammed-bert-cpu.yaml"


def mean_std(values: list[float]) -> str:
    """Mean ± standard deviation (not a 95% interval) x 100, search.analysis.stats's `a ± b` formatting."""
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return plus_minus(statistics.mean(values), spread, 1, scale=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="data directory, e.g. ../shared/data")
    parser.add_argument("--budget", default="5m", help="pretraining budget of the pretrained encoder")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--tasks", default=",".join(DEFAULT_PROBE_TASKS))
    parser.add_argument("--max-train-examples", type=int, default=ProbeLimits.max_train_examples)
    parser.add_argument("--max-seconds-per-task", type=float, default=ProbeLimits.max_seconds_per_task)
    parser.add_argument("--checkpoint", help="probe this pretrained checkpoint instead of cramming one")
    parser.add_argument("--config", default=str(CONFIG), help="run config to cram (default: crammed-bert-cpu)")
    args = parser.parse_args()

    run = load_run_config(args.config)
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = args.checkpoint
        if checkpoint is None:
            data = prepare_data(CorpusSource.from_args(data_dir=args.data), vocab_size=run.arch.vocab_size,
                                seq_len=run.arch.max_seq_len)
            checkpoint = Path(scratch) / "pretrained"
            result = cram(run.arch, run.train, data, Budget.parse(args.budget), out_dir=checkpoint)
            print(f"crammed {run.name} for {args.budget}: {result.tokens:,} tokens, "
                  f"validation MLM loss {result.validation_loss:.3f}")
        pretrained, tokenizer = load_checkpoint(checkpoint)

        scores: dict[str, dict[str, list[float]]] = {"pretrained": {}, "random": {}}
        seconds: dict[str, list[float]] = {"pretrained": [], "random": []}
        for seed in range(args.seeds):
            torch.manual_seed(seed)
            # The random encoder is the checkpoint's architecture, freshly initialised.
            encoders = {"pretrained": pretrained, "random": CrammedBert(pretrained.arch).eval()}
            limits = ProbeLimits(max_train_examples=args.max_train_examples,
                                 max_seconds_per_task=args.max_seconds_per_task, seed=seed, data_dir=args.data)
            for name, encoder in encoders.items():
                outcome = probe(encoder, tokenizer, tasks=args.tasks, limits=limits)
                for entry, score in {**outcome.scores, "average": outcome.average}.items():
                    scores[name].setdefault(entry, []).append(score)
                seconds[name].append(outcome.seconds["total"])
                shown = " ".join(f"{entry}={100 * score:.1f}" for entry, score in outcome.scores.items())
                print(f"seed {seed} {name:>10}: {shown} average={100 * outcome.average:.1f} "
                      f"({outcome.seconds['total']:.1f} s)")

    pretrained_label = Path(args.checkpoint).name if args.checkpoint else args.budget
    print(f"\n| entry (main metric x 100) | pretrained ({pretrained_label}) | random init | difference |")
    print("|---|---|---|---|")
    for entry, values in scores["pretrained"].items():
        random_values = scores["random"][entry]
        difference = [a - b for a, b in zip(values, random_values)]
        print(f"| {entry} | {mean_std(values)} | {mean_std(random_values)} | {mean_std(difference)} |")
    every_probe = seconds["pretrained"] + seconds["random"]
    print(f"\nprobe wall time: mean {statistics.mean(every_probe):.1f} s, max {max(every_probe):.1f} s "
          f"over {len(every_probe)} probes (tasks {args.tasks})")


if __name__ == "__main__":
    main()
