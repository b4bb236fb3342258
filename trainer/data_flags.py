"""The data flags every CLI shares, declared once: `--data` or `--corpus` (one of the two), and
`--cache-dir`.

Kept free of heavy imports (no torch, no datasets) so that a CLI can parse and check its flags
before it loads anything.
"""

from __future__ import annotations

import argparse

CACHE_HELP = "token cache (default: $CRAMNAS_CACHE or ~/.cache/cramnas)"


def add_data_arguments(parser: argparse.ArgumentParser, *, corpus: bool = True, cache_dir: bool = True,
                       data_help: str | None = None) -> None:
    """Add `--data DIR` and, unless `corpus=False`, the exclusive `--corpus HUB_ID`; then `--cache-dir`.

    `data_help` says what this CLI reads from DIR (pretraining corpus, GLUE tasks or both)."""
    where = parser.add_mutually_exclusive_group() if corpus else parser
    where.add_argument("--data", metavar="DIR", help=data_help or
                       "local data: DIR/pretrain/<name>/{train,validation}.parquet and DIR/glue/<task>/ "
                       "(default: the Hugging Face hub)")
    if corpus:
        where.add_argument("--corpus", metavar="HUB_ID",
                           help="a Hugging Face hub dataset for pretraining, streamed (default: WikiText-103 raw on a "
                           "CPU, FineWeb-Edu sample-100BT on a GPU)")
    if cache_dir:
        parser.add_argument("--cache-dir", help=CACHE_HELP)
