"""Tokenisation tokens/s on this machine's cores: run once per thread count.

    RAYON_NUM_THREADS=1 python benchmarks/tokenize_speed.py --data ../shared/data
    RAYON_NUM_THREADS=2 python benchmarks/tokenize_speed.py --data ../shared/data

The prepared data's WordPiece tokenizer (`prepare_data`, a cache hit after the first call)
encodes the first `--articles` training articles with `encode_batch_fast`, as preparation does;
best of 3. `tokenizers` parallelises over `RAYON_NUM_THREADS` threads (default: all cores).
"""

from __future__ import annotations

import argparse
import os
import time

from trainer.cache import cache_root
from trainer.corpus import Corpus, CorpusSource
from trainer.data import prepare_data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--articles", type=int, default=400)
    args = parser.parse_args()
    source = CorpusSource.from_args(data_dir=args.data)
    tokenizer = prepare_data(source, vocab_size=args.vocab_size, seq_len=args.seq_len).tokenizer
    train = Corpus(source, cache_root() / "hf-datasets").documents.train
    texts = [row["text"] for row in train.select(range(args.articles))]
    best = 0.0
    for _ in range(3):
        start = time.perf_counter()
        tokens = sum(len(encoding.ids) for encoding in tokenizer.encode_batch_fast(texts, add_special_tokens=False))
        best = max(best, tokens / (time.perf_counter() - start))
    print(f"RAYON_NUM_THREADS={os.environ.get('RAYON_NUM_THREADS', 'all')} tokens={tokens:,} best tokens/s={best:,.0f}")


if __name__ == "__main__":
    main()
