"""Size sweep: which layers x hidden of crammed-bert-cpu (with rotary positions) learns most per budget?

    CRAMNAS_CACHE=/tmp/cramnas-cache python benchmarks/size_sweep.py --data ../shared/data [--budget 2e12flops]

crammed-bert-cpu's architecture and recipe with `position: rotary`, at each `--sizes` entry
(`LAYERSxHIDDEN`; heads chosen so head_dim is 64 where hidden allows, else 32), crammed once with
the same seed at the same budget; only the size changes. Every finished cram is appended to `--out`
and a second call skips what is there (resumable: `search.analysis.crams.CramStore`). Printed: a
table sorted by validation MLM loss, the best first; its size is what trainer/configs/sized-cpu.yaml
uses (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from search.analysis.crams import Cram, CramStore
from search.run import CONFIGS
from space.arch import ArchConfig
from trainer.budget import Budget
from trainer.config import load_run_config
from trainer.corpus import CorpusSource
from trainer.cram import cram
from trainer.data import prepare_data

SIZES = ("1x32", "1x64", "1x128", "2x64", "2x128", "3x96", "4x128")


def sized(base: ArchConfig, size: str) -> ArchConfig:
    """`base` with rotary positions at `LAYERSxHIDDEN`, head_dim 64 if hidden is a multiple of 64, else 32."""
    layers, hidden = (int(part) for part in size.split("x"))
    head_dim = 64 if hidden % 64 == 0 else 32
    return base.replace(layers=layers, hidden=hidden, heads=hidden // head_dim, position="rotary")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="data directory, e.g. ../shared/data")
    parser.add_argument("--base", default="crammed-bert-cpu", help="trainer/configs/<name>.yaml to resize")
    parser.add_argument("--sizes", default=",".join(SIZES), help="comma-separated LAYERSxHIDDEN")
    parser.add_argument("--budget", default="2e12flops", help="per cram (default: 2e12flops)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (one core, as a CPU trial)")
    parser.add_argument("--out", default="size_sweep.jsonl", help="finished crams, one JSON line each (resumable)")
    parser.add_argument("--cache-dir")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    run = load_run_config(CONFIGS / f"{args.base}.yaml")
    budget = Budget.parse(args.budget)
    store = CramStore(Path(args.out), lambda row: (row["size"], row["budget"]))
    sizes = args.sizes.split(",")
    archs = {size: sized(run.arch, size) for size in sizes}
    crams = [Cram({"size": size, "budget": budget.text, "heads": arch.heads, "arch": arch.to_dict()}, arch, arch, size, size)
             for size, arch in archs.items()]
    if store.pending(crams):
        data = prepare_data(CorpusSource.from_args(data_dir=args.data), vocab_size=run.arch.vocab_size,
                            seq_len=run.arch.max_seq_len, cache_dir=args.cache_dir)
        store.run(crams, lambda arch: result_row(cram(arch, run.train, data, budget)))
    rows = [store.done[(size, budget.text)] for size in sizes]
    failed = [row["size"] for row in rows if row["validation_loss"] is None]
    if failed:
        print(f"note: left out, their crams failed: {', '.join(failed)}")
    rows = sorted((row for row in rows if row["validation_loss"] is not None), key=lambda row: row["validation_loss"])
    print(f"\n{args.base} with rotary positions at {budget.text}, seed {run.train.seed}:\n"
          "| layers x hidden | heads | params | tokens | steps | validation loss | nats below unigram |\n"
          "|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['size']} | {row['heads']} | {row['params'] / 1e6:.3f}M | {row['tokens']:,} | {row['steps']} | "
              f"{row['validation_loss']:.3f} | {row['nats_below_unigram']:+.3f} |")
    print(f"\nbest: {rows[0]['size']}")


def result_row(result) -> dict:
    return {"params": result.params, "validation_loss": result.validation_loss,
            "nats_below_unigram": result.nats_below_unigram, "tokens": result.tokens, "steps": result.steps,
            "tokens_per_s": result.tokens_per_s, "seconds": result.seconds}


if __name__ == "__main__":
    main()
