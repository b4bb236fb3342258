"""Pretraining data: a corpus turned into packed, tokenised MLM sequences, cached on disk.

    source = CorpusSource.from_args(data_dir="../shared/data")
    data = prepare_data(source, vocab_size=32768, seq_len=128)
    batches = data.batches(batch_size=64, seed=0)               # LongTensor (64, 128), forever
    inputs, labels = mask_tokens(next(batches), 0.25, special_ids=data.special_ids,
                                 vocab_size=data.vocab_size)
    python -m trainer.data --data ../shared/data --vocab-size 8192     # prepare, print a summary
    python -m trainer.data --corpus HuggingFaceFW/fineweb-edu --max-tokens 2e9   # stream 2e9 tokens
    (the command line is trainer/data_cli.py)

The pipeline, in order, one module a step: `trainer.corpus` (where the text comes from),
`trainer.tokenizer` (the WordPiece tokenizer), `trainer.packing` (documents into rows), this
module (preparing, caching and opening the rows), then `trainer.masking` at training time and
`trainer.unigram` for the floor every loss is read against.
What `prepare_data` does, each step cached so that a second call only opens files:
1. Check the settings and the source: bad input fails with a one-line `DataError` before any
   tokenisation (a missing text column or an empty corpus as soon as the corpus is loaded).
2. Get the tokenizer: `tokenizer_file`, or one trained on a sample of the train documents and
   cached (`trainer.tokenizer`).
3. Pack the validation set (the validation split, or the held-out tail of the train documents:
   `trainer.corpus`). Only its first `max_validation_sequences` rows are kept, so it is the same
   set on every call.
4. Tokenise and pack the train documents (`trainer.packing`: rows [CLS] chunk [SEP] cut from one
   token stream): all of them, or, with `max_tokens`, only until the packed rows hold that many
   tokens (a streamed corpus stops reading there too).
5. Compute the unigram floor of the packed arrays (`trainer.unigram`) for the manifest.
6. Write <cache>/data/<fingerprint>/{train.bin, validation.bin, tokenizer.json, manifest.json}
   into a temporary directory and rename it into place (`trainer.atomic`), so that a killed
   preparation never leaves a directory that looks complete. The .bin files are raw row-major token arrays
   (uint16 when the vocabulary fits, else int32); the manifest gives their shapes. A manifest
   written before the floor existed gets it added on first open (`trainer.cache` for the layout).

On a Ray cluster the driver prepares the data and a trial opens it by its fingerprint
(`open_prepared`): from its machine's cache, or, on a machine without the entry, from the
driver's files (`entry_files`, shipped through Ray by `search.study.driver`), written into that
machine's cache once, so that no trial tokenises the corpus again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from trainer.atomic import atomic_directory, write_atomically
from trainer.budget import Budget
from trainer.cache import FORMAT_VERSION, cache_root, digest, locked
from trainer.corpus import HELD_OUT_FRACTION, Corpus, CorpusSource, DataError, Documents, logged
from trainer.packing import write_packed
from trainer.references import compute_references, shown_positions
from trainer.tokenizer import (
    NORMALIZATIONS,
    SPECIAL_TOKENS,
    TOKENIZER_SAMPLE_CHARS,
    load_tokenizer_file,
    special_ids,
    tokenizer_sha256,
    trained_tokenizer,
)
from trainer.unigram import token_counts, unigram_floor
from trainer.validation import validation_masks

MIN_SEQ_LEN = 8
# Bumped when trainer/references.py changes what it computes: cached manifests then recompute them.
REFERENCES_VERSION = 1
MANIFEST = "manifest.json"
# A cache entry's files: what a machine needs to open it without the corpus (`entry_files`).
ENTRY_FILES = ("train.bin", "validation.bin", "tokenizer.json", MANIFEST)
# What a streamed corpus prepares when neither max_tokens nor a token budget says: ~1 hour of
# crammed BERT at an estimated 5e5 tokens/s on an H200, 4 GB of uint16 rows.
STREAM_DEFAULT_TOKENS = 2_000_000_000

logger = logging.getLogger(__name__)


@dataclass
class PretrainData:
    """Packed pretraining sequences and the tokenizer that made them."""

    train: np.memmap  # (N, seq_len) token ids, read from disk on demand
    validation: np.ndarray  # (M, seq_len), the fixed validation set
    tokenizer: Tokenizer
    tokenizer_path: Path
    fingerprint: str
    seq_len: int
    vocab_size: int
    special_ids: dict[str, int]  # pad, unk, cls, sep, mask
    manifest: dict
    from_cache: bool

    @property
    def unigram_floor(self) -> float:
        """The validation loss of predicting from train token frequencies alone (`trainer.unigram`)."""
        return self.manifest["unigram_floor"]

    @property
    def corruption_floor(self) -> float:
        """Frequencies plus copying what BERT's corruption leaves unchanged: the loss of having
        learned nothing (`trainer.references`)."""
        return self.manifest["references"]["corruption_floor"]

    @property
    def context_reference(self) -> float:
        """The loss of a count model that sees a masked token's two neighbours (`trainer.references`)."""
        return self.manifest["references"]["context_reference"]

    def batches(self, batch_size: int, seed: int = 0, start: int = 0) -> Iterator[torch.Tensor]:
        """Shuffled training batches, LongTensor (batch_size, seq_len), forever.

        Rows come epoch after epoch, each epoch a fresh permutation of all rows (a batch may span
        two epochs). The same seed gives the same batches. `start` skips that many rows of this
        stream without reading them: a resumed run (trainer/resume.py) goes on in the same order.
        """
        rng = np.random.default_rng(seed)
        for _ in range(start // len(self.train)):  # whole epochs: only their permutations are drawn
            rng.permutation(len(self.train))
        order = rng.permutation(len(self.train))[start % len(self.train):]
        while True:
            while len(order) < batch_size:
                order = np.concatenate([order, rng.permutation(len(self.train))])
            rows, order = order[:batch_size], order[batch_size:]
            yield torch.from_numpy(self.train[rows].astype(np.int64))

    def validation_batches(self, batch_size: int) -> Iterator[torch.Tensor]:
        """The validation set in order, LongTensor batches of up to batch_size rows."""
        for start in range(0, len(self.validation), batch_size):
            yield torch.from_numpy(self.validation[start : start + batch_size].astype(np.int64))


def prepare_data(
    source: CorpusSource,
    *,
    vocab_size: int = 32768,
    seq_len: int = 128,
    normalization: str = "cramming",
    tokenizer_file: str | os.PathLike | None = None,
    cache_dir: str | os.PathLike | None = None,
    max_validation_sequences: int = 512,
    tokenizer_sample_chars: int = TOKENIZER_SAMPLE_CHARS,
    max_tokens: int | None = None,
) -> PretrainData:
    """Tokenised, packed train and validation sequences for `source`, prepared once and cached.

    `normalization` applies to a tokenizer trained here; a `tokenizer_file` keeps its own
    normaliser (and must have exactly `vocab_size` tokens). `max_tokens` stops the train rows at
    ceil(max_tokens / seq_len), the fewest that hold that many tokens; None packs a loaded corpus
    whole and STREAM_DEFAULT_TOKENS of a streamed one (`tokens_to_prepare` derives it from a budget).
    """
    _check_settings(vocab_size, seq_len, normalization, max_validation_sequences, tokenizer_sample_chars)
    if max_tokens is None and source.streaming:
        max_tokens = STREAM_DEFAULT_TOKENS
    if max_tokens is not None and max_tokens < 1:
        raise DataError(f"max_tokens={max_tokens} must be positive; e.g. 2e9, or leave it out for the whole corpus")
    start = time.perf_counter()
    timings: dict[str, float] = {}
    root = cache_root(cache_dir)
    try:  # now, not after the tokenizer has been trained
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataError(f"cache directory {root}: cannot create it ({error.strerror}); "
                        "pass a writable --cache-dir (or set CRAMNAS_CACHE)") from None
    corpus = Corpus(source, root / "hf-datasets")
    with _timed(timings, "tokenizer"):
        if tokenizer_file is not None:
            tokenizer = load_tokenizer_file(Path(tokenizer_file).expanduser(), vocab_size)
            normalization = "from tokenizer file"
        else:
            tokenizer = trained_tokenizer(corpus, vocab_size, normalization, tokenizer_sample_chars, root)
    identity = {
        "format_version": FORMAT_VERSION,
        "source": source.identity(),
        "normalization": normalization,
        "tokenizer_sha256": tokenizer_sha256(tokenizer),
        "seq_len": seq_len,
        "max_validation_sequences": max_validation_sequences,
        "held_out_fraction": HELD_OUT_FRACTION,
        # Only when set: data prepared whole keeps the fingerprint it had before max_tokens existed.
        **({"max_tokens": int(max_tokens)} if max_tokens is not None else {}),
    }
    fingerprint = digest(identity)
    data_dir = root / "data" / fingerprint
    from_cache = (data_dir / MANIFEST).is_file()
    if not from_cache:
        manifest = {
            "fingerprint": fingerprint,
            **identity,
            "source_description": source.description,
            "vocab_size": vocab_size,
            "tokenizer_file": str(tokenizer_file) if tokenizer_file is not None else None,
            "tokenizer_sample_chars": tokenizer_sample_chars if tokenizer_file is None else None,
            "dtype": np.dtype(np.uint16 if vocab_size <= 2**16 else np.int32).name,
            "special_ids": special_ids(tokenizer),
        }
        _build(data_dir, corpus.documents, tokenizer, manifest, timings, start)
    return _open(data_dir, tokenizer, from_cache)


def entry_files(fingerprint: str, cache_dir: str | os.PathLike | None = None) -> dict[str, np.ndarray]:
    """The files of the prepared entry `fingerprint` as byte arrays mapped from disk, not read:
    what the driver ships to the machines of a Ray cluster (`open_prepared`)."""
    data_dir = cache_root(cache_dir) / "data" / fingerprint
    return {name: np.asarray(np.memmap(data_dir / name, dtype=np.uint8, mode="r")) for name in ENTRY_FILES}


def open_prepared(
    fingerprint: str,
    cache_dir: str | os.PathLike | None = None,
    fetch: Callable[[], Mapping[str, np.ndarray]] | None = None,
) -> tuple[PretrainData, str]:
    """The prepared data `fingerprint` and where it came from: "cache", this machine's cache entry,
    or "shipped", `fetch()`'s files (`entry_files` of another machine) written into this cache first.
    Processes that start together on a machine without the entry take turns on a lock, so only the
    first fetches and writes it. Needs no corpus; DataError when the entry is missing and no `fetch`."""
    data_dir = cache_root(cache_dir) / "data" / fingerprint
    source = "cache"
    if not (data_dir / MANIFEST).is_file():
        if fetch is None:
            raise DataError(f"prepared data {fingerprint} is not in {data_dir.parent}; prepare it with the same "
                            "settings on this machine, or point CRAMNAS_CACHE (--cache-dir) at a shared cache")
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        with locked(data_dir.parent / f".{fingerprint}.lock"):
            if not (data_dir / MANIFEST).is_file():  # no process wrote it while this one waited
                _install(fetch(), data_dir)
                source = "shipped"
    tokenizer = Tokenizer.from_file(str(data_dir / "tokenizer.json"))
    return _open(data_dir, tokenizer, from_cache=source == "cache"), source


def tokens_to_prepare(source: CorpusSource, budget: Budget, flops_per_token: float | None = None) -> int | None:
    """`max_tokens` for a run under `budget`: of a streamed corpus, the tokens a token budget trains
    on (a FLOP budget's too, given the model's FLOPs per token). None, prepare_data's default,
    otherwise: a loaded corpus is prepared whole, and a wall-clock budget's tokens are unknown
    before training (the streamed default, STREAM_DEFAULT_TOKENS, then applies), and so are those of
    reference-core seconds not yet resolved for an architecture (`Budget.resolve`)."""
    tokens = budget.tokens(flops_per_token)
    return math.ceil(tokens) if source.streaming and tokens is not None else None


def _build(
    data_dir: Path,
    documents: Documents,
    tokenizer: Tokenizer,
    manifest: dict,
    timings: dict[str, float],
    start: float,
) -> None:
    seq_len, dtype = manifest["seq_len"], manifest["dtype"]
    # prepare_data takes a data directory with a manifest as complete: `atomic_directory` gives it
    # its name only once every file is written, so a killed preparation leaves none that looks so.
    with atomic_directory(data_dir, if_exists="keep") as staged:
        # Validation first: it is small, and a corpus too short for it fails before the long part.
        with _timed(timings, "validation"), logged("packed the validation set"):
            validation = staged.write("validation.bin", lambda path: write_packed(
                documents.validation, tokenizer, seq_len, dtype, path, "validation",
                max_rows=manifest["max_validation_sequences"]))
        if not validation["sequences"]:
            raise DataError(
                f"the validation text ({documents.validation_origin}) is too short for one sequence of "
                f"seq_len={seq_len}; give more validation text or a smaller seq_len"
            )
        max_tokens = manifest.get("max_tokens")
        with _timed(timings, "train"), logged("tokenised and packed the train documents"):
            train = staged.write("train.bin", lambda path: write_packed(
                documents.train, tokenizer, seq_len, dtype, path, "train",
                max_rows=-(-max_tokens // seq_len) if max_tokens is not None else None))
        if not train["sequences"]:
            raise DataError(
                f"the train text ({train['document_tokens']} tokens) is too short for one sequence of "
                f"seq_len={seq_len}; give more text or a smaller seq_len"
            )
        staged.write("tokenizer.json", lambda path: tokenizer.save(str(path)))
        timings["total"] = round(time.perf_counter() - start, 2)
        manifest.update(
            train=train,
            validation={"origin": documents.validation_origin, **validation},
            seconds=timings,
            created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        )
        staged.write(MANIFEST, lambda path: path.write_text(json.dumps(manifest, indent=2) + "\n"))
    logger.info(
        "prepared %s: %d train and %d validation sequences of %d tokens in %.1f s",
        data_dir,
        train["sequences"],
        validation["sequences"],
        seq_len,
        timings["total"],
    )


def _install(files: Mapping[str, np.ndarray], data_dir: Path) -> None:
    """Write an entry's files (`entry_files`) as `data_dir`, whole or not at all, like `_build`."""
    with atomic_directory(data_dir, if_exists="keep") as staged:
        for name in ENTRY_FILES:
            staged.write(name, files[name].tofile)
    logger.info("wrote %s from the driver's prepared data", data_dir)


def _open(data_dir: Path, tokenizer: Tokenizer, from_cache: bool) -> PretrainData:
    manifest = json.loads((data_dir / MANIFEST).read_text())
    seq_len, dtype = manifest["seq_len"], np.dtype(manifest["dtype"])
    train = np.memmap(
        data_dir / "train.bin", dtype=dtype, mode="r", shape=(manifest["train"]["sequences"], seq_len)
    )
    validation = np.fromfile(data_dir / "validation.bin", dtype=dtype).reshape(-1, seq_len)
    if "unigram_floor" not in manifest or manifest.get("references", {}).get("version") != REFERENCES_VERSION:
        # Computed on the first open, of a fresh directory or of one prepared before they existed,
        # and kept in the manifest: a cached directory stays valid without a FORMAT_VERSION bump.
        _add_references(manifest, train, validation)
        try:
            write_atomically(data_dir / MANIFEST, json.dumps(manifest, indent=2) + "\n")
        except OSError as error:  # a read-only cache: the references are recomputed on each open
            logger.warning("cannot store the loss references in %s: %s", data_dir / MANIFEST, error)
    return PretrainData(
        train=train,
        validation=validation,
        tokenizer=tokenizer,
        tokenizer_path=data_dir / "tokenizer.json",
        fingerprint=manifest["fingerprint"],
        seq_len=seq_len,
        vocab_size=manifest["vocab_size"],
        special_ids=manifest["special_ids"],
        manifest=manifest,
        from_cache=from_cache,
    )


def _add_references(manifest: dict, train: np.memmap, validation: np.ndarray) -> None:
    """The unigram floor, corruption floor and context reference of these rows (trainer/references.py)."""
    specials, vocab_size = manifest["special_ids"], manifest["vocab_size"]
    with logged("computed the unigram floor"):
        train_counts = token_counts(train, vocab_size)
        manifest["unigram_floor"] = unigram_floor(train, validation, set(specials.values()), vocab_size,
                                                  train_counts=train_counts)
    with logged("computed the corruption floor and the two-neighbour context reference"):
        shown = shown_positions(((ids.numpy(), labels.numpy()) for ids, labels in
                                 validation_masks(validation, specials, vocab_size)), specials["mask"])
        manifest["references"] = {"version": REFERENCES_VERSION, **compute_references(
            train, shown, train_counts, set(specials.values()), vocab_size, specials["mask"])}


def _check_settings(vocab_size: int, seq_len: int, normalization: str, max_validation_sequences: int,
                    tokenizer_sample_chars: int) -> None:
    if normalization not in NORMALIZATIONS:
        raise DataError(f"unknown normalization={normalization!r}; choose one of {', '.join(NORMALIZATIONS)}")
    if vocab_size <= len(SPECIAL_TOKENS):
        raise DataError(
            f"vocab_size={vocab_size} leaves no room beside the {len(SPECIAL_TOKENS)} special tokens; "
            "use e.g. 8192 or 32768"
        )
    if seq_len < MIN_SEQ_LEN:
        raise DataError(f"seq_len={seq_len} is too short; use at least {MIN_SEQ_LEN} (128 is usual)")
    if max_validation_sequences < 1:
        raise DataError(
            f"max_validation_sequences={max_validation_sequences} must be at least 1 (512 is usual)"
        )
    if tokenizer_sample_chars < 1:
        raise DataError(
            f"tokenizer_sample_chars={tokenizer_sample_chars} must be positive "
            f"(default {TOKENIZER_SAMPLE_CHARS})"
        )


@contextlib.contextmanager
def _timed(timings: dict[str, float], step: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    timings[step] = round(time.perf_counter() - start, 2)


if __name__ == "__main__":  # `python -m trainer.data`: the command line is trainer/data_cli.py's
    from trainer.data_cli import main

    raise SystemExit(main())
