"""Corpus sources: where the pretraining text comes from, and its documents once loaded.

    source = CorpusSource.from_args(data_dir="../shared/data")   # or corpus="Salesforce/wikitext"
    documents = Corpus(source, hf_cache).documents                # train and validation documents

Sources: a Hugging Face hub dataset (by default WikiText-103 raw on a CPU, FineWeb-Edu on a GPU:
`default_hub_corpus`), a directory in the layout
DATA/pretrain/<name>/{train,validation}.parquet, a directory holding the split files directly, or
.parquet/.txt/.jsonl files. In a directory, files named validation* form the validation split,
files named test* are ignored and all others are train. A .txt file holds one document per block
of lines separated by a blank line; a .jsonl file one document per line in its "text" field.

`CorpusSource` checks the files when it is made, so a missing directory or an empty file fails
with a one-line `DataError` before anything is loaded; a missing text column or a corpus without
text fails as soon as the documents are loaded. The validation documents are the validation split
when the corpus has one, else the last 1% of the train documents, held out of training and of
tokenizer training. `datasets` keeps its own Arrow copy of loaded corpora under
<cache>/hf-datasets/. Loading is lazy: a cache hit of the prepared data never loads the corpus.

A hub corpus streams (`datasets.load_dataset(..., streaming=True)`): documents are read as they are
tokenised and nothing is downloaded beyond what preparation reads, so a corpus of billions of
tokens costs only the tokens a study needs (`max_tokens` of `trainer.data.prepare_data`). A
streamed corpus has no known end, so without a validation split its first
STREAM_HELD_OUT_DOCUMENTS documents are the validation set instead of the last 1%. Local files
stream too when asked (`streaming=True`), through the same code.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cached_property, lru_cache
from pathlib import Path

import datasets
import pyarrow.parquet as pq
from tqdm import tqdm

from space.errors import CramnasError

DEFAULT_HUB_CORPUS = "Salesforce/wikitext"  # on a CPU: ~100M words, enough for minutes of cramming
DEFAULT_HUB_CONFIG = "wikitext-103-raw-v1"
# On a GPU: FineWeb-Edu (ODC-By 1.0), educational English web pages filtered from Common Crawl. Its
# 100B-token sample holds ~2x the tokens a 24-hour H200 cram reads (~4e10, if crammed BERT runs at an
# estimated ~5e5 tokens/s), where
# WikiText-103 (~1.2e8) would be read hundreds of times; a sample, rather than the full 1.3T tokens
# in crawl order, so that the first documents streamed already mix all crawls.
GPU_HUB_CORPUS = "HuggingFaceFW/fineweb-edu"
GPU_HUB_CONFIG = "sample-100BT"
# The config a known hub corpus gets when --corpus names it without one.
HUB_CONFIGS = {DEFAULT_HUB_CORPUS: DEFAULT_HUB_CONFIG, GPU_HUB_CORPUS: GPU_HUB_CONFIG}

# Local file suffix -> the `datasets` builder that reads it.
FILE_BUILDERS = {".parquet": "parquet", ".txt": "text", ".jsonl": "json"}

# Without a validation split, this tail fraction of the train documents is held out instead;
HELD_OUT_FRACTION = 0.01
# of a streamed corpus, whose tail is unknown, these first documents (a FineWeb-Edu page averages
# ~1,000 tokens: enough for 512 validation rows of 512 tokens).
STREAM_HELD_OUT_DOCUMENTS = 1000
# Documents per encode_batch call: enough to keep every core busy, few enough that a batch of
# long Wikipedia articles holds about 300 MB of Encoding objects.
ENCODE_BATCH_DOCS = 256

logger = logging.getLogger(__name__)


class DataError(CramnasError):
    """Bad data input; the one-line message names the problem and the fix."""


@lru_cache(maxsize=256)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    """A file's sha256, read once per process while its size and mtime stay (about 0.1 s for the
    40 MB of ../shared/data's corpus)."""
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


@dataclass(frozen=True)
class CorpusSource:
    """Where the pretraining text comes from: a hub dataset, or resolved local files."""

    text_column: str = "text"
    hub_id: str | None = None
    hub_config: str | None = None
    file_format: str | None = None  # the `datasets` builder of local files: parquet, text or json
    train_files: tuple[Path, ...] = ()
    validation_files: tuple[Path, ...] = ()
    streaming: bool = False  # read documents as they are tokenised (hub corpora), not loaded first

    @classmethod
    def from_args(
        cls,
        data_dir: str | os.PathLike | None = None,
        corpus: str | None = None,
        corpus_config: str | None = None,
        text_column: str = "text",
        name: str | None = None,
        gpu: bool = False,
        streaming: bool | None = None,
    ) -> CorpusSource:
        """Local files (`data_dir`, a directory or a file) or a hub dataset id (`corpus`), not both;
        neither means the default hub corpus of the device (`default_hub_corpus(gpu)`). `name`
        picks one corpus of DATA/pretrain/. `streaming`: None streams hub corpora and loads local
        files; True or False forces it."""
        if data_dir is not None and corpus is not None:
            raise DataError(
                "give either data_dir (--data, local files) or corpus (--corpus, a hub id), not both"
            )
        if data_dir is not None:
            local = cls._from_local(Path(data_dir).expanduser(), name, text_column)
            return replace(local, streaming=bool(streaming))
        if name is not None:
            raise DataError(
                f"name={name!r} picks a corpus under DATA/pretrain/; it needs data_dir (--data DATA)"
            )
        corpus = corpus or default_hub_corpus(gpu)
        return cls(text_column=text_column, hub_id=corpus, hub_config=corpus_config or HUB_CONFIGS.get(corpus),
                   streaming=streaming is not False)

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
        """What the prepared data depends on: hub coordinates, or each file's size and content
        digest, in order (a copy, a move or a fresh checkout of the same files is the same data; a
        path and mtime would key it anew each time); and whether it streams (which documents are
        held out differs)."""
        streamed = {"streaming": True} if self.streaming else {}
        if self.hub_id is not None:
            return {
                "hub": self.hub_id,
                "config": self.hub_config,
                "splits": "train+validation",
                "column": self.text_column,
                **streamed,
            }

        def stat(files: tuple[Path, ...]) -> list:
            return [[(found := file.stat()).st_size, _file_digest(str(file), found.st_size, found.st_mtime_ns)]
                    for file in files]

        return {
            "format": self.file_format,
            "column": self.text_column,
            "train": stat(self.train_files),
            "validation": stat(self.validation_files),
            **streamed,
        }


def default_hub_corpus(gpu: bool) -> str:
    """The hub corpus used without --data or --corpus: one a GPU cannot exhaust, or a small one."""
    return GPU_HUB_CORPUS if gpu else DEFAULT_HUB_CORPUS


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
class Documents:
    train: datasets.Dataset | datasets.IterableDataset  # one column, "text"; iterable when streamed
    validation: datasets.Dataset | datasets.IterableDataset
    validation_origin: str


class Corpus:
    """The documents of a source, loaded on first use: a cache hit never loads them."""

    def __init__(self, source: CorpusSource, hf_cache: Path):
        self.source = source
        self.hf_cache = hf_cache

    @cached_property
    def documents(self) -> Documents:
        with logged(f"{'opened' if self.source.streaming else 'loaded'} {self.source.description}"):
            splits = self._load_splits()
        train = self._text_only(splits["train"], "train")
        if self.source.streaming:
            return self._streamed(splits, train)
        if not any(text.strip() for batch in text_batches(train) for text in batch):
            raise DataError(f"{self.source.description} has no text: all {len(train)} train rows are empty")
        if "validation" in splits and len(splits["validation"]):
            return Documents(train, self._text_only(splits["validation"], "validation"), "validation split")
        held_out = max(1, math.ceil(len(train) * HELD_OUT_FRACTION))
        if held_out >= len(train):
            raise DataError(
                f"{self.source.description} has a single document and no validation split; "
                "add a validation file"
            )
        kept = len(train) - held_out
        return Documents(
            train.select(range(kept)),
            train.select(range(kept, len(train))),
            f"last {held_out} of {len(train)} train documents (held out of training)",
        )

    def _streamed(self, splits: datasets.IterableDatasetDict, train: datasets.IterableDataset) -> Documents:
        """A stream's documents: read lazily, so an empty corpus shows up when it is packed."""
        if "validation" in splits:
            return Documents(train, self._text_only(splits["validation"], "validation"), "validation split")
        return Documents(
            train.skip(STREAM_HELD_OUT_DOCUMENTS),
            train.take(STREAM_HELD_OUT_DOCUMENTS),
            f"first {STREAM_HELD_OUT_DOCUMENTS} train documents (held out of training)",
        )

    def _load_splits(self) -> datasets.DatasetDict | datasets.IterableDatasetDict:
        source = self.source
        streaming = {"streaming": True} if source.streaming else {}
        if source.hub_id is None:
            data_files = {"train": [str(file) for file in source.train_files]}
            if source.validation_files:
                data_files["validation"] = [str(file) for file in source.validation_files]
            options = {"sample_by": "paragraph"} if source.file_format == "text" else {}
            try:
                return datasets.load_dataset(
                    source.file_format, data_files=data_files, cache_dir=str(self.hf_cache), **options, **streaming
                )
            except ValueError as error:  # e.g. a text file of blank lines yields no rows at all
                raise DataError(f"{source.description} has no text: {str(error).splitlines()[0]}") from error
        try:
            splits = datasets.load_dataset(source.hub_id, source.hub_config, cache_dir=str(self.hf_cache), **streaming)
        except Exception as error:  # offline, unknown id, missing config...: one line, whatever the cause
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise DataError(
                f"cannot load {source.description}: {reason}; check the id and config, the network "
                "(HF_HUB_OFFLINE / HF_DATASETS_OFFLINE), or use local files with --data"
            ) from error
        if "train" not in splits:
            raise DataError(f"{source.description} has no train split (splits: {', '.join(splits)})")
        return splits

    def _text_only(self, split, split_name: str):
        """`split` (a Dataset or, streamed, an IterableDataset) with only its text column, named "text"."""
        column = self.source.text_column
        if split.column_names is not None and column not in split.column_names:
            raise DataError(
                f"{self.source.description}, {split_name} split: no text column {column!r} "
                f"(columns: {', '.join(split.column_names)}); pick one with text_column= (--text-column)"
            )
        split = split.select_columns([column])
        return split if column == "text" else split.rename_column(column, "text")


def text_batches(
    documents: datasets.Dataset | datasets.IterableDataset, progress: str | None = None
) -> Iterator[list[str]]:
    """The document texts in batches of ENCODE_BATCH_DOCS, missing and empty ones left out."""
    batches = documents.iter(batch_size=ENCODE_BATCH_DOCS)
    if progress is not None:
        # disable=None: a bar on a terminal, nothing in logs; a stream has no known length.
        total = math.ceil(len(documents) / ENCODE_BATCH_DOCS) if isinstance(documents, datasets.Dataset) else None
        batches = tqdm(batches, desc=progress, total=total, disable=None)
    for batch in batches:
        yield [text for text in batch["text"] if text]


@contextlib.contextmanager
def logged(what: str) -> Iterator[None]:
    """Log `what` with the seconds the block took: each step of the data pipeline says its cost."""
    start = time.perf_counter()
    yield
    logger.info("%s in %.1f s", what, time.perf_counter() - start)
