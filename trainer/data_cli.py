"""`python -m trainer.data`: prepare (or find cached) pretraining data and print a summary.

    python -m trainer.data --data ../shared/data --vocab-size 8192
    python -m trainer.data --corpus HuggingFaceFW/fineweb-edu --max-tokens 2e9

The library it drives is `trainer.data` (`prepare_data`), whose `main` hands its arguments here.
"""

from __future__ import annotations

import argparse
import logging
import math
import time

import torch

from space.errors import CramnasError
from trainer.console import CliParser, one_line_on_ctrl_c
from trainer.corpus import HUB_CONFIGS, CorpusSource
from trainer.data import STREAM_DEFAULT_TOKENS, prepare_data
from trainer.data_flags import add_data_arguments
from trainer.tokenizer import NORMALIZATIONS, TOKENIZER_SAMPLE_CHARS


def token_count(text: str) -> int:
    """A --max-tokens value: a positive whole number, 2000000000 or 2e9."""
    try:
        count = float(text)
    except ValueError:
        count = 0.0
    if not (1 <= count < math.inf) or count != int(count):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number of tokens; write e.g. 2e9")
    return int(count)


def build_parser() -> CliParser:
    """The command line of `python -m trainer.data` (docs/cli.md is generated from it: docs/gen_cli.py)."""
    parser = CliParser(
        prog="python -m trainer.data", description="Prepare (or find cached) pretraining data."
    )
    add_data_arguments(parser, data_help="local data: DATA (with pretrain/<name>/), a corpus directory or a file")
    parser.add_argument(
        "--corpus-config", help="hub dataset config (default: " + ", ".join(
            f"{config} for {corpus}" for corpus, config in HUB_CONFIGS.items()) + ")"
    )
    parser.add_argument("--name", help="which corpus of DATA/pretrain/ when there are several")
    parser.add_argument("--text-column", default="text", help="the column of the corpus's files that holds the text")
    parser.add_argument("--vocab-size", type=int, default=32768, help="tokens in the WordPiece vocabulary trained")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per packed row, [CLS] and [SEP] included")
    parser.add_argument("--normalization", default="cramming", help=f"one of {', '.join(NORMALIZATIONS)}")
    parser.add_argument("--tokenizer-file", help="use this tokenizer.json instead of training one")
    parser.add_argument("--tokenizer-sample-chars", type=int, default=TOKENIZER_SAMPLE_CHARS,
                        help="characters of the corpus the tokenizer is trained on, at most")
    parser.add_argument("--max-validation-sequences", type=int, default=512,
                        help="validation rows kept: the first N, the same set on every call")
    parser.add_argument("--max-tokens", type=token_count, metavar="N",
                        help="stop once the train rows hold N tokens, e.g. 2e9 (default: the whole corpus; "
                        f"{STREAM_DEFAULT_TOKENS:,} of a streamed hub corpus)")
    return parser


@one_line_on_ctrl_c
def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")

    start = time.perf_counter()
    try:
        source = CorpusSource.from_args(
            args.data, args.corpus, args.corpus_config, args.text_column, args.name, gpu=torch.cuda.is_available()
        )
        data = prepare_data(
            source,
            vocab_size=args.vocab_size,
            seq_len=args.seq_len,
            normalization=args.normalization,
            tokenizer_file=args.tokenizer_file,
            cache_dir=args.cache_dir,
            max_validation_sequences=args.max_validation_sequences,
            tokenizer_sample_chars=args.tokenizer_sample_chars,
            max_tokens=args.max_tokens,
        )
    except CramnasError as error:
        parser.exit(2, f"error: {error}\n")
    seconds = time.perf_counter() - start

    manifest = data.manifest
    train, validation = manifest["train"], manifest["validation"]
    print(f"fingerprint  {data.fingerprint}  ({'cache hit' if data.from_cache else 'prepared now'})")
    print(f"directory    {data.tokenizer_path.parent}")
    print(f"source       {manifest['source_description']}")
    end = (f"{train['dropped_tail_tokens']} dropped as the tail" if "dropped_tail_tokens" in train
           else f"stopped at max_tokens={manifest['max_tokens']:,}")
    print(
        f"train        {train['sequences']:,} sequences x {data.seq_len} tokens from {train['documents']:,} "
        f"documents ({train['document_tokens']:,} tokens; {end})"
    )
    print(f"validation   {validation['sequences']:,} sequences from the {validation['origin']}")
    print(f"tokenizer    {data.vocab_size:,} tokens, normalization {manifest['normalization']}")
    print(f"unigram      floor {data.unigram_floor:.4f} nats, the validation loss of predicting from token "
          "frequencies alone")
    steps = ", ".join(f"{step} {value:.1f} s" for step, value in manifest["seconds"].items())
    print(f"time         {seconds:.2f} s for this call; preparation took: {steps}")
