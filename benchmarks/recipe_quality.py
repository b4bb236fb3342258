"""Crammed recipe against original BERT at equal CPU wall-clock, side by side in one process.

    python benchmarks/recipe_quality.py --data ../shared/data [--budget 5m]

Both `crammed-bert-cpu` and `bert-original-cpu` cram the same corpus with the same tokenizer
(vocab 8192, seq 128) for the same wall-clock budget, one after the other; the validation MLM loss
(fixed held-out sequences, masked at 15% with a fixed seed for both) is printed for each, with the
difference. Cramming claims the crammed recipe wins at equal budget.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from trainer.budget import Budget
from trainer.config import load_run_config
from trainer.corpus import CorpusSource
from trainer.cram import cram
from trainer.data import prepare_data

CONFIGS = Path(__file__).resolve().parents[1] / "trainer" / "configs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="data directory, e.g. ../shared/data")
    parser.add_argument("--budget", default="5m")
    parser.add_argument("--cache-dir")
    args = parser.parse_args()

    budget = Budget.parse(args.budget)
    runs = {name: load_run_config(CONFIGS / f"{name}.yaml") for name in ("crammed-bert-cpu", "bert-original-cpu")}
    vocab = {(run.arch.vocab_size, run.arch.max_seq_len) for run in runs.values()}
    assert len(vocab) == 1, "both recipes must share one tokenizer and sequence length"
    vocab_size, seq_len = vocab.pop()
    data = prepare_data(CorpusSource.from_args(data_dir=args.data), vocab_size=vocab_size, seq_len=seq_len,
                        cache_dir=args.cache_dir)
    losses = {}
    for name, run in runs.items():
        result = cram(run.arch, run.train, data, budget)
        losses[name] = result.validation_loss
        print(f"{name:>18}: validation MLM loss {result.validation_loss:.4f}  params={result.params / 1e6:.2f}M  "
              f"tokens={result.tokens:,}  steps={result.steps}  tokens/s={result.tokens_per_s:,.0f}  "
              f"seconds={result.seconds:.1f}")
    difference = losses["bert-original-cpu"] - losses["crammed-bert-cpu"]
    print(f"budget={budget.text} loss crammed={losses['crammed-bert-cpu']:.4f} "
          f"original={losses['bert-original-cpu']:.4f} original-crammed={difference:+.4f}")


if __name__ == "__main__":
    main()
