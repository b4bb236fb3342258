"""Size sweep: which layers x hidden of crammed-bert-cpu (with rotary positions) learns most per budget?

    CRAMNAS_CACHE=/tmp/cramnas-cache python benchmarks/size_sweep.py --data ../shared/data [--budget 2e12flops]

crammed-bert-cpu's architecture and recipe with `position: rotary`, at each `--sizes` entry
(`LAYERSxHIDDEN`; heads chosen so head_dim is 64 where hidden allows, else 32), crammed once with
the same seed at the same budget; only the size changes. Every finished cram is appended to `--out`
and a second call skips what is there (resumable). Printed: a table sorted by validation MLM loss,
the best first; its size is what trainer/configs/sized-cpu.yaml uses (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

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
    out = Path(args.out)
    done = {}
    if out.exists():
        for line in out.read_text().splitlines():
            row = json.loads(line)
            done[(row["size"], row["budget"])] = row
    data = prepare_data(CorpusSource.from_args(data_dir=args.data), vocab_size=run.arch.vocab_size,
                        seq_len=run.arch.max_seq_len, cache_dir=args.cache_dir)
    sizes = args.sizes.split(",")
    for size in sizes:
        if (size, budget.text) in done:
            continue
        arch = sized(run.arch, size)
        result = cram(arch, run.train, data, budget)
        row = {"size": size, "budget": budget.text, "heads": arch.heads, "params": result.params,
               "validation_loss": result.validation_loss, "nats_below_unigram": result.nats_below_unigram,
               "tokens": result.tokens, "steps": result.steps, "tokens_per_s": result.tokens_per_s,
               "arch": arch.to_dict()}
        done[(size, budget.text)] = row
        with out.open("a") as file:
            file.write(json.dumps(row) + "\n")
        print(f"  {size}: validation loss {row['validation_loss']:.4f}, {row['tokens']:,} tokens", flush=True)
    rows = sorted((done[(size, budget.text)] for size in sizes), key=lambda row: row["validation_loss"])
    print(f"\n{args.base} with rotary positions at {budget.text}, seed {run.train.seed}:\n"
          "| layers x hidden | heads | params | tokens | steps | validation loss | nats below unigram |\n"
          "|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['size']} | {row['heads']} | {row['params'] / 1e6:.3f}M | {row['tokens']:,} | {row['steps']} | "
              f"{row['validation_loss']:.3f} | {row['nats_below_unigram']:+.3f} |")
    print(f"\nbest: {rows[0]['size']}")


if __name__ == "__main__":
    main()
