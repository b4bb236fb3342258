"""Pretraining data: a text corpus turned into packed, tokenised MLM sequences, cached on disk.

    source = CorpusSource.from_args(data_dir="../shared/data")
    data = prepare_data(source, vocab_size=32768, seq_len=128)
    batches = data.batches(batch_size=64, seed=0)               # LongTensor (64, 128), forever
    inputs, labels = mask_tokens(next(batches), 0.25, special_ids=data.special_ids,
                                 vocab_size=data.vocab_size)

What `prepare_data` does, each step cached so that a second call only opens files:
1. Check the settings and the source: bad input fails with a one-line `DataError` before any
   tokenisation (a missing text column or an empty corpus as soon as the corpus is loaded).
2. Get a WordPiece tokenizer: `tokenizer_file`, or one trained on a bounded sample of the train
   documents (the first ones, up to `tokenizer_sample_chars` characters; 100M by default), cached
   under <cache>/tokenizers/ by corpus identity, vocabulary size, normalisation and sample size.
3. Pack the validation set: the validation split when the corpus has one, else the last 1% of the
   train documents (held out of training and of tokenizer training). Only its first
   `max_validation_sequences` rows are kept, so it is the same set on every call.
4. Tokenise and pack all train documents. Packing: the documents form one token stream with [SEP]
   between documents; the stream is cut into chunks of seq_len - 2 tokens and every row is
   [CLS] chunk [SEP]. Only the incomplete last chunk is dropped (< seq_len - 2 tokens in all).
   Documents that are empty after normalisation are skipped.
5. Write <cache>/data/<fingerprint>/{train.bin, validation.bin, tokenizer.json, manifest.json}
   into a temporary directory and rename it into place, so that a killed preparation never
   leaves a directory that looks complete. The .bin files are raw row-major token arrays
   (uint16 when the vocabulary fits, else int32); the manifest gives their shapes.

The cache root is `cache_dir`, else $CRAMNAS_CACHE, else ~/.cache/cramnas. `datasets` keeps its
own Arrow copy of loaded corpora under <cache>/hf-datasets/.

Sources: a Hugging Face hub dataset (default WikiText-103 raw), a directory in the layout
DATA/pretrain/<name>/{train,validation}.parquet, a directory holding the split files directly, or
.parquet/.txt/.jsonl files. In a directory, files named validation* form the validation split,
files named test* are ignored and all others are train. A .txt file holds one document per block
of lines separated by a blank line; a .jsonl file one document per line in its "text" field.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import os
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import datasets
import numpy as np
import pyarrow.parquet as pq
import torch
from tokenizers import Tokenizer
from tqdm import tqdm

from trainer.tokenizer import NORMALIZATIONS, SPECIAL_TOKENS, special_ids, tokenizer_sha256, train_wordpiece

# Part of every fingerprint: bump it when the cache layout or the packing changes.
FORMAT_VERSION = 1

DEFAULT_HUB_CORPUS = "Salesforce/wikitext"
DEFAULT_HUB_CONFIG = "wikitext-103-raw-v1"

# Local file suffix -> the `datasets` builder that reads it.
FILE_BUILDERS = {".parquet": "parquet", ".txt": "text", ".jsonl": "json"}

TOKENIZER_SAMPLE_CHARS = 100_000_000
# Without a validation split, this tail fraction of the train documents is held out instead.
HELD_OUT_FRACTION = 0.01
MIN_SEQ_LEN = 8
# Documents per encode_batch call: enough to keep every core busy, few enough that a batch of
# long Wikipedia articles holds about 300 MB of Encoding objects.
ENCODE_BATCH_DOCS = 256

# MLM corruption of the selected positions, as in BERT: 80% [MASK], 10% random, 10% unchanged.
MASK_FRACTION = 0.8
RANDOM_FRACTION = 0.1
# Label of positions that are not predicted (the default ignore_index of cross_entropy).
IGNORE_INDEX = -100

MANIFEST = "manifest.json"

logger = logging.getLogger(__name__)


class DataError(ValueError):
    """Bad data input; the one-line message names the problem and the fix."""


@dataclass(frozen=True)
class CorpusSource:
    """Where the pretraining text comes from: a hub dataset, or resolved local files."""

    text_column: str = "text"
    hub_id: str | None = None
    hub_config: str | None = None
    file_format: str | None = None  # the `datasets` builder of local files: parquet, text or json
    train_files: tuple[Path, ...] = ()
    validation_files: tuple[Path, ...] = ()

    @classmethod
    def from_args(
        cls,
        data_dir: str | os.PathLike | None = None,
        corpus: str | None = None,
        corpus_config: str | None = None,
        text_column: str = "text",
        name: str | None = None,
    ) -> CorpusSource:
        """Local files (`data_dir`, a directory or a file) or a hub dataset id (`corpus`), not both;
        neither means WikiText-103 raw from the hub. `name` picks one corpus of DATA/pretrain/."""
        if data_dir is not None and corpus is not None:
            raise DataError(
                "give either data_dir (--data, local files) or corpus (--corpus, a hub id), not both"
            )
        if data_dir is not None:
            return cls._from_local(Path(data_dir).expanduser(), name, text_column)
        if name is not None:
            raise DataError(
                f"name={name!r} picks a corpus under DATA/pretrain/; it needs data_dir (--data DATA)"
            )
        if corpus is None:
            corpus, corpus_config = DEFAULT_HUB_CORPUS, corpus_config or DEFAULT_HUB_CONFIG
        return cls(text_column=text_column, hub_id=corpus, hub_config=corpus_config)

    @classmethod
    def _from_local(cls, path: Path, name: str | None, text_column: str) -> CorpusSource:
        if not path.exists():
            raise DataError(
                f"data path {path} does not exist; pass a directory holding pretrain/<name>/train.parquet, "
                "a corpus directory, or a .parquet/.txt/.jsonl file"
            )
        if path.is_file():
            if path.suffix not in FILE_BUILDERS:
                raise DataError(f"{path}: unsupported file type; use {', '.join(FILE_BUILDERS)} files")
            files = [path]
        else:
            files = _data_files(_corpus_dir(path, name))
        formats = sorted({FILE_BUILDERS[file.suffix] for file in files})
        if len(formats) > 1:
            raise DataError(
                f"{files[0].parent} mixes file formats ({', '.join(formats)}); keep one per corpus"
            )
        validation = tuple(file.resolve() for file in files if file.name.startswith("validation"))
        train = tuple(file.resolve() for file in files if not file.name.startswith("validation"))
        if not train:
            raise DataError(
                f"{files[0].parent} has validation files but no train files; add train{files[0].suffix}"
            )
        if all(file.stat().st_size == 0 for file in train):
            raise DataError(f"{files[0].parent} has no text: its train files are empty")
        if formats[0] == "parquet":
            _check_parquet_rows(files)
        return cls(
            text_column=text_column, file_format=formats[0], train_files=train, validation_files=validation
        )

    @property
    def description(self) -> str:
        if self.hub_id is not None:
            return f"hub dataset {self.hub_id}" + (f" ({self.hub_config})" if self.hub_config else "")
        return f"{self.file_format} files in {self.train_files[0].parent}"

    def identity(self) -> dict:
        """What the prepared data depends on: hub coordinates, or each file's path, size and mtime."""
        if self.hub_id is not None:
            return {
                "hub": self.hub_id,
                "config": self.hub_config,
                "splits": "train+validation",
                "column": self.text_column,
            }

        def stat(files: tuple[Path, ...]) -> list:
            return [[str(file), file.stat().st_size, file.stat().st_mtime_ns] for file in files]

        return {
            "format": self.file_format,
            "column": self.text_column,
            "train": stat(self.train_files),
            "validation": stat(self.validation_files),
        }


def _check_parquet_rows(files: list[Path]) -> None:
    """`datasets` fails on a parquet file without rows with a traceback about batch sizes: name it."""
    for file in files:
        try:
            rows = pq.read_metadata(file).num_rows
        except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
            raise DataError(f"{file} is not a readable parquet file ({str(error).splitlines()[0]}); "
                            "replace it or remove it") from None
        if rows == 0:
            raise DataError(f"{file} has no rows; remove it or write the corpus into it")


def _data_files(directory: Path) -> list[Path]:
    """The corpus files directly in `directory`; test* files never go into pretraining."""
    return sorted(
        file
        for file in directory.iterdir()
        if file.is_file() and file.suffix in FILE_BUILDERS and not file.name.startswith("test")
    )


def _corpus_dir(path: Path, name: str | None) -> Path:
    """`path` itself when it holds corpus files, else the (named or only) corpus below it."""
    if name is None and _data_files(path):
        return path
    parent = path / "pretrain" if (path / "pretrain").is_dir() else path
    corpora = sorted(entry.name for entry in parent.iterdir() if entry.is_dir() and _data_files(entry))
    if name is not None:
        if name in corpora:
            return parent / name
        raise DataError(f"no corpus named {name!r} in {parent}; available: {', '.join(corpora) or 'none'}")
    if len(corpora) == 1:
        return parent / corpora[0]
    if not corpora:
        raise DataError(
            f"no recognisable corpus in {path}: expected pretrain/<name>/train.parquet "
            "(+ validation.parquet), train/validation .parquet files, or .txt/.jsonl files"
        )
    raise DataError(f"{parent} holds several corpora ({', '.join(corpora)}); choose one with name= (--name)")


@dataclass
class _Documents:
    train: datasets.Dataset  # one column, "text"
    validation: datasets.Dataset
    validation_origin: str


class _Corpus:
    """The documents of a source, loaded on first use: a cache hit never loads them."""

    def __init__(self, source: CorpusSource, hf_cache: Path):
        self.source = source
        self.hf_cache = hf_cache

    @cached_property
    def documents(self) -> _Documents:
        with _logged(f"loaded {self.source.description}"):
            splits = self._load_splits()
        train = self._text_only(splits["train"], "train")
        if not any(text.strip() for batch in _text_batches(train) for text in batch):
            raise DataError(f"{self.source.description} has no text: all {len(train)} train rows are empty")
        if "validation" in splits and len(splits["validation"]):
            return _Documents(train, self._text_only(splits["validation"], "validation"), "validation split")
        held_out = max(1, math.ceil(len(train) * HELD_OUT_FRACTION))
        if held_out >= len(train):
            raise DataError(
                f"{self.source.description} has a single document and no validation split; "
                "add a validation file"
            )
        kept = len(train) - held_out
        return _Documents(
            train.select(range(kept)),
            train.select(range(kept, len(train))),
            f"last {held_out} of {len(train)} train documents (held out of training)",
        )

    def _load_splits(self) -> datasets.DatasetDict:
        source = self.source
        if source.hub_id is None:
            data_files = {"train": [str(file) for file in source.train_files]}
            if source.validation_files:
                data_files["validation"] = [str(file) for file in source.validation_files]
            options = {"sample_by": "paragraph"} if source.file_format == "text" else {}
            try:
                return datasets.load_dataset(
                    source.file_format, data_files=data_files, cache_dir=str(self.hf_cache), **options
                )
            except ValueError as error:  # e.g. a text file of blank lines yields no rows at all
                raise DataError(f"{source.description} has no text: {str(error).splitlines()[0]}") from error
        try:
            splits = datasets.load_dataset(source.hub_id, source.hub_config, cache_dir=str(self.hf_cache))
        except Exception as error:  # offline, unknown id, missing config...: one line, whatever the cause
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise DataError(
                f"cannot load {source.description}: {reason}; check the id and config, the network "
                "(HF_HUB_OFFLINE / HF_DATASETS_OFFLINE), or use local files with --data"
            ) from error
        if "train" not in splits:
            raise DataError(f"{source.description} has no train split (splits: {', '.join(splits)})")
        return splits

    def _text_only(self, split: datasets.Dataset, split_name: str) -> datasets.Dataset:
        column = self.source.text_column
        if column not in split.column_names:
            raise DataError(
                f"{self.source.description}, {split_name} split: no text column {column!r} "
                f"(columns: {', '.join(split.column_names)}); pick one with text_column= (--text-column)"
            )
        split = split.select_columns([column])
        return split if column == "text" else split.rename_column(column, "text")


def _text_batches(documents: datasets.Dataset, progress: str | None = None) -> Iterator[list[str]]:
    """The document texts in batches of ENCODE_BATCH_DOCS, missing and empty ones left out."""
    batches = documents.iter(batch_size=ENCODE_BATCH_DOCS)
    if progress is not None:
        # disable=None: a bar on a terminal, nothing in logs.
        batches = tqdm(
            batches, desc=progress, total=math.ceil(len(documents) / ENCODE_BATCH_DOCS), disable=None
        )
    for batch in batches:
        yield [text for text in batch["text"] if text]


def _tokenizer_sample(documents: datasets.Dataset, max_chars: int) -> Iterator[list[str]]:
    """The first documents, up to and including the one that reaches `max_chars` characters."""
    taken = 0
    for batch in _text_batches(documents):
        for end, text in enumerate(batch, start=1):
            taken += len(text)
            if taken >= max_chars:
                yield batch[:end]
                return
        yield batch


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """`cache_dir`, else $CRAMNAS_CACHE, else ~/.cache/cramnas."""
    return Path(
        cache_dir or os.environ.get("CRAMNAS_CACHE") or Path.home() / ".cache" / "cramnas"
    ).expanduser()


def _digest(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _timed(timings: dict[str, float], step: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    timings[step] = round(time.perf_counter() - start, 2)


@contextlib.contextmanager
def _logged(what: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    logger.info("%s in %.1f s", what, time.perf_counter() - start)


def _check_settings(
    vocab_size: int,
    seq_len: int,
    normalization: str,
    max_validation_sequences: int,
    tokenizer_sample_chars: int,
) -> None:
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


def _load_tokenizer_file(path: Path, vocab_size: int) -> Tokenizer:
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises a bare Exception for unreadable or invalid files
        raise DataError(
            f"cannot read tokenizer file {path} ({error}); give a tokenizers JSON file"
        ) from error
    ids = special_ids(tokenizer)
    missing = [token for name, token in SPECIAL_TOKENS.items() if ids[name] is None]
    if missing:
        raise DataError(
            f"tokenizer file {path} lacks {' '.join(missing)}; "
            f"cramnas needs {' '.join(SPECIAL_TOKENS.values())}"
        )
    if tokenizer.get_vocab_size() != vocab_size:
        size = tokenizer.get_vocab_size()
        raise DataError(
            f"tokenizer file {path} has {size} tokens, not vocab_size={vocab_size}; pass vocab_size={size}"
        )
    # Packing needs whole documents, whatever the file was set up for.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def _trained_tokenizer(
    corpus: _Corpus, vocab_size: int, normalization: str, sample_chars: int, root: Path
) -> Tokenizer:
    key = _digest(
        {
            "format_version": FORMAT_VERSION,
            "source": corpus.source.identity(),
            "vocab_size": vocab_size,
            "normalization": normalization,
            "sample_chars": sample_chars,
            "held_out_fraction": HELD_OUT_FRACTION,
        }
    )
    path = root / "tokenizers" / f"{key}.json"
    if path.exists():
        return Tokenizer.from_file(str(path))
    train = corpus.documents.train
    with _logged(f"trained a {vocab_size}-token WordPiece tokenizer on up to {sample_chars:,} characters"):
        tokenizer = train_wordpiece(_tokenizer_sample(train, sample_chars), vocab_size, normalization)
    if tokenizer.get_vocab_size() > vocab_size:
        needed = tokenizer.get_vocab_size()
        raise DataError(
            f"vocab_size={vocab_size} is smaller than the corpus alphabet, which alone needs "
            f"{needed} tokens; use vocab_size >= {needed}"
        )
    # Written under a temporary name and renamed: a killed run leaves no truncated tokenizer.
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{uuid.uuid4().hex[:8]}.tmp")
    partial.write_text(tokenizer.to_str())
    partial.replace(path)
    return tokenizer


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

    def batches(self, batch_size: int, seed: int = 0) -> Iterator[torch.Tensor]:
        """Shuffled training batches, LongTensor (batch_size, seq_len), forever.

        Rows come epoch after epoch, each epoch a fresh permutation of all rows (a batch may span
        two epochs). The same seed gives the same batches.
        """
        rng = np.random.default_rng(seed)
        order = np.empty(0, dtype=np.int64)
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
) -> PretrainData:
    """Tokenised, packed train and validation sequences for `source`, prepared once and cached.

    `normalization` applies to a tokenizer trained here; a `tokenizer_file` keeps its own
    normaliser (and must have exactly `vocab_size` tokens).
    """
    _check_settings(vocab_size, seq_len, normalization, max_validation_sequences, tokenizer_sample_chars)
    start = time.perf_counter()
    timings: dict[str, float] = {}
    root = cache_root(cache_dir)
    try:  # now, not after the tokenizer has been trained
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise DataError(f"cache directory {root}: cannot create it ({error.strerror}); "
                        "pass a writable --cache-dir (or set CRAMNAS_CACHE)") from None
    corpus = _Corpus(source, root / "hf-datasets")
    with _timed(timings, "tokenizer"):
        if tokenizer_file is not None:
            tokenizer = _load_tokenizer_file(Path(tokenizer_file).expanduser(), vocab_size)
            normalization = "from tokenizer file"
        else:
            tokenizer = _trained_tokenizer(corpus, vocab_size, normalization, tokenizer_sample_chars, root)
    identity = {
        "format_version": FORMAT_VERSION,
        "source": source.identity(),
        "normalization": normalization,
        "tokenizer_sha256": tokenizer_sha256(tokenizer),
        "seq_len": seq_len,
        "max_validation_sequences": max_validation_sequences,
        "held_out_fraction": HELD_OUT_FRACTION,
    }
    fingerprint = _digest(identity)
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


def pack_sequences(
    token_chunks: Iterable[np.ndarray], seq_len: int, cls_id: int, sep_id: int
) -> Iterator[np.ndarray]:
    """Cut one token stream, arriving in chunks of any length, into rows [CLS] + seq_len - 2
    stream tokens + [SEP]. Yields (n, seq_len) int64 blocks; the incomplete tail is dropped."""
    body = seq_len - 2
    carry = np.empty(0, dtype=np.int64)
    for chunk in token_chunks:
        stream = np.concatenate([carry, chunk])
        rows = len(stream) // body
        carry = stream[rows * body :]
        if rows:
            block = np.empty((rows, seq_len), dtype=np.int64)
            block[:, 0] = cls_id
            block[:, 1:-1] = stream[: rows * body].reshape(rows, body)
            block[:, -1] = sep_id
            yield block


@dataclass
class _StreamCount:
    documents: int = 0
    tokens: int = 0  # document tokens, without the [SEP]s between documents


def _token_stream(
    tokenizer: Tokenizer, text_batches: Iterable[list[str]], sep_id: int, count: _StreamCount
) -> Iterator[np.ndarray]:
    """All documents as one token stream with [SEP] between documents, one chunk per batch."""
    separator = np.array([sep_id], dtype=np.int64)
    for texts in text_batches:
        pieces = []
        # encode_batch_fast runs on all cores and skips the offsets packing does not need.
        for encoding in tokenizer.encode_batch_fast(texts, add_special_tokens=False):
            ids = encoding.ids
            if not ids:  # nothing left after normalisation: no document, no [SEP]
                continue
            if count.documents:
                pieces.append(separator)
            pieces.append(np.asarray(ids, dtype=np.int64))
            count.documents += 1
            count.tokens += len(ids)
        if pieces:
            yield np.concatenate(pieces)


def _write_packed(
    documents: datasets.Dataset,
    tokenizer: Tokenizer,
    seq_len: int,
    dtype: str,
    path: Path,
    label: str,
    max_rows: int | None = None,
) -> dict:
    """Tokenise, pack and write `documents` as raw rows to `path`; returns their counts."""
    ids = special_ids(tokenizer)
    count = _StreamCount()
    written = 0
    stream = _token_stream(
        tokenizer, _text_batches(documents, progress=f"tokenising {label}"), ids["sep"], count
    )
    with open(path, "wb") as out:
        for block in pack_sequences(stream, seq_len, ids["cls"], ids["sep"]):
            if max_rows is not None:
                block = block[: max_rows - written]
            block.astype(dtype).tofile(out)
            written += len(block)
            if written == max_rows:
                break
    stats = {"documents": count.documents, "document_tokens": count.tokens, "sequences": written}
    if max_rows is None:
        stream_tokens = count.tokens + max(count.documents - 1, 0)
        stats["dropped_tail_tokens"] = stream_tokens - written * (seq_len - 2)
    return stats


def _build(
    data_dir: Path,
    documents: _Documents,
    tokenizer: Tokenizer,
    manifest: dict,
    timings: dict[str, float],
    start: float,
) -> None:
    seq_len, dtype = manifest["seq_len"], manifest["dtype"]
    building = data_dir.parent / f".{data_dir.name}.{uuid.uuid4().hex[:8]}"
    building.mkdir(parents=True)
    try:
        # Validation first: it is small, and a corpus too short for it fails before the long part.
        with _timed(timings, "validation"), _logged("packed the validation set"):
            validation = _write_packed(
                documents.validation,
                tokenizer,
                seq_len,
                dtype,
                building / "validation.bin",
                "validation",
                max_rows=manifest["max_validation_sequences"],
            )
        if not validation["sequences"]:
            raise DataError(
                f"the validation text ({documents.validation_origin}) is too short for one sequence of "
                f"seq_len={seq_len}; give more validation text or a smaller seq_len"
            )
        with _timed(timings, "train"), _logged("tokenised and packed the train documents"):
            train = _write_packed(documents.train, tokenizer, seq_len, dtype, building / "train.bin", "train")
        if not train["sequences"]:
            raise DataError(
                f"the train text ({train['document_tokens']} tokens) is too short for one sequence of "
                f"seq_len={seq_len}; give more text or a smaller seq_len"
            )
        tokenizer.save(str(building / "tokenizer.json"))
        timings["total"] = round(time.perf_counter() - start, 2)
        manifest.update(
            train=train,
            validation={"origin": documents.validation_origin, **validation},
            seconds=timings,
            created=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        )
        # prepare_data takes a data directory with a manifest as complete: the rename below is
        # atomic, so only a finished directory ever carries its final name.
        (building / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        _publish(building, data_dir)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    logger.info(
        "prepared %s: %d train and %d validation sequences of %d tokens in %.1f s",
        data_dir,
        train["sequences"],
        validation["sequences"],
        seq_len,
        timings["total"],
    )


def _publish(building: Path, data_dir: Path) -> None:
    """Move a finished directory into place in one atomic rename."""
    try:
        building.rename(data_dir)
    except OSError:
        # Another process prepared the same data meanwhile: theirs is as good as ours.
        if not (data_dir / MANIFEST).is_file():
            raise
        shutil.rmtree(building)


def _open(data_dir: Path, tokenizer: Tokenizer, from_cache: bool) -> PretrainData:
    manifest = json.loads((data_dir / MANIFEST).read_text())
    seq_len, dtype = manifest["seq_len"], np.dtype(manifest["dtype"])
    train = np.memmap(
        data_dir / "train.bin", dtype=dtype, mode="r", shape=(manifest["train"]["sequences"], seq_len)
    )
    validation = np.fromfile(data_dir / "validation.bin", dtype=dtype).reshape(-1, seq_len)
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


def mask_tokens(
    input_ids: torch.Tensor,
    rate: float = 0.25,
    *,
    special_ids: Mapping[str, int],
    vocab_size: int,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's MLM corruption of a batch (B, T), as Cramming and Hugging Face's collator do it.

    Every position that is not a special token is selected independently with probability
    `rate` (Bernoulli: the count per row varies around rate x maskable positions). Of the
    selected positions, 80% become [MASK], 10% a uniformly drawn non-special token and 10% stay
    as they are. Returns (masked_input_ids, labels); labels hold the original token at selected
    positions and -100 elsewhere. The input is not modified.
    """
    device = input_ids.device
    specials = torch.tensor(sorted(set(special_ids.values())), device=device)
    selected = (torch.rand(input_ids.shape, generator=generator, device=device) < rate) & ~torch.isin(
        input_ids, specials
    )
    labels = torch.where(selected, input_ids, IGNORE_INDEX)

    action = torch.rand(input_ids.shape, generator=generator, device=device)
    to_mask = selected & (action < MASK_FRACTION)
    to_random = selected & (action >= MASK_FRACTION) & (action < MASK_FRACTION + RANDOM_FRACTION)
    all_ids = torch.arange(vocab_size, device=device)
    ordinary_ids = all_ids[~torch.isin(all_ids, specials)]
    random_ids = ordinary_ids[
        torch.randint(len(ordinary_ids), input_ids.shape, generator=generator, device=device)
    ]

    masked = torch.where(to_mask, special_ids["mask"], input_ids)
    masked = torch.where(to_random, random_ids, masked)
    return masked, labels


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.data", description="Prepare (or find cached) pretraining data."
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--data", metavar="DIR", help="local data: DATA (with pretrain/<name>/), a corpus directory or a file"
    )
    where.add_argument(
        "--corpus", metavar="HUB_ID", help=f"a Hugging Face hub dataset (default {DEFAULT_HUB_CORPUS})"
    )
    parser.add_argument(
        "--corpus-config", help=f"hub dataset config (default {DEFAULT_HUB_CONFIG} for the default corpus)"
    )
    parser.add_argument("--name", help="which corpus of DATA/pretrain/ when there are several")
    parser.add_argument("--text-column", default="text")
    parser.add_argument("--vocab-size", type=int, default=32768)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--normalization", default="cramming", help=f"one of {', '.join(NORMALIZATIONS)}")
    parser.add_argument("--tokenizer-file", help="use this tokenizer.json instead of training one")
    parser.add_argument("--tokenizer-sample-chars", type=int, default=TOKENIZER_SAMPLE_CHARS)
    parser.add_argument("--max-validation-sequences", type=int, default=512)
    parser.add_argument("--cache-dir", help="cache root (default $CRAMNAS_CACHE or ~/.cache/cramnas)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")

    start = time.perf_counter()
    try:
        source = CorpusSource.from_args(
            args.data, args.corpus, args.corpus_config, args.text_column, args.name
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
        )
    except DataError as error:
        parser.exit(2, f"error: {error}\n")
    seconds = time.perf_counter() - start

    manifest = data.manifest
    train, validation = manifest["train"], manifest["validation"]
    print(f"fingerprint  {data.fingerprint}  ({'cache hit' if data.from_cache else 'prepared now'})")
    print(f"directory    {data.tokenizer_path.parent}")
    print(f"source       {manifest['source_description']}")
    print(
        f"train        {train['sequences']:,} sequences x {data.seq_len} tokens from {train['documents']:,} "
        f"documents ({train['document_tokens']:,} tokens; {train['dropped_tail_tokens']} dropped as the tail)"
    )
    print(f"validation   {validation['sequences']:,} sequences from the {validation['origin']}")
    print(f"tokenizer    {data.vocab_size:,} tokens, normalization {manifest['normalization']}")
    steps = ", ".join(f"{step} {value:.1f} s" for step, value in manifest["seconds"].items())
    print(f"time         {seconds:.2f} s for this call; preparation took: {steps}")


if __name__ == "__main__":
    main()
