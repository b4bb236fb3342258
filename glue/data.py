"""GLUE data: load a task's splits, tokenise them with the checkpoint's tokenizer, batch them.

Two sources, with the same column names (those of the hub dataset `nyu-mll/glue`):
- the hub: `datasets.load_dataset("nyu-mll/glue", task)` (needs the network or the HF cache);
- a local directory DATA holding DATA/glue/<task>/{train,validation}.parquet (MNLI:
  validation_matched.parquet and validation_mismatched.parquet instead of validation.parquet).

A task needs its train split and every validation split. `resolve_tasks` checks that for all tasks
asked for before anything is loaded, so a missing file fails in one line naming the task and path.

Tokenisation: [CLS] A [SEP] for single sentences, [CLS] A [SEP] B [SEP] for pairs with
token_type_ids 0 for A and 1 for B (the model ignores them unless arch.segment_embeddings),
truncated to the model's max_seq_len, the longer text of a pair losing tokens first. Batches are
padded to their own longest row (dynamic padding): GLUE sentences are mostly far shorter than 128.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import torch
from tokenizers import Tokenizer

from glue.tasks import TASKS, GlueError, Task, get_task
from trainer.tokenizer import pair_template

HUB_DATASET = "nyu-mll/glue"


# ---------------------------------------------------------------------------------------------
# Which tasks, and where their files are
# ---------------------------------------------------------------------------------------------


def glue_root(data_dir: str | os.PathLike) -> Path:
    """DATA/glue when it exists, else DATA itself (a directory of task folders)."""
    data = Path(data_dir).expanduser()
    if not data.is_dir():
        raise GlueError(f"GLUE data directory {data} does not exist; pass a directory holding glue/<task>/*.parquet")
    return data / "glue" if (data / "glue").is_dir() else data


def split_files(task: Task, data_dir: str | os.PathLike) -> dict[str, Path]:
    folder = glue_root(data_dir) / task.name
    return {split: folder / f"{split}.parquet" for split in ("train", *task.validation_splits)}


def missing_files(task: Task, data_dir: str | os.PathLike) -> list[Path]:
    return [path for path in split_files(task, data_dir).values() if not path.is_file()]


def why_unavailable(task: Task, data_dir: str | os.PathLike) -> str | None:
    """None when the task can be fine-tuned from `data_dir`, else the reason in a few words."""
    missing = missing_files(task, data_dir)
    if not missing:
        return None
    files = split_files(task, data_dir)
    if files["train"] in missing and len(missing) < len(files):
        return f"validation only: {files['train']} is missing, and fine-tuning needs it"
    return f"missing {', '.join(str(path) for path in missing)}"


def resolve_tasks(spec: str | Iterable[str], data_dir: str | os.PathLike | None = None) -> list[Task]:
    """`all`, `available`, a comma-separated list (`rte,sst2`) or an iterable of names -> tasks.

    `available` means the tasks with train and validation files under `data_dir` (every task when
    the data comes from the hub). With a `data_dir`, every task asked for must be present there.
    """
    if isinstance(spec, str) and spec.strip().lower() == "all":
        tasks = list(TASKS.values())
    elif isinstance(spec, str) and spec.strip().lower() == "available":
        if data_dir is None:
            return list(TASKS.values())
        tasks = [task for task in TASKS.values() if why_unavailable(task, data_dir) is None]
        if not tasks:
            raise GlueError(f"no GLUE task has both train and validation files under {glue_root(data_dir)}; "
                            "expected glue/<task>/train.parquet and validation.parquet")
    else:
        names = spec.split(",") if isinstance(spec, str) else list(spec)
        tasks = list(dict.fromkeys(get_task(name) for name in names if name.strip()))
        if not tasks:
            raise GlueError(f"no GLUE task given; choose from all, available, {', '.join(TASKS)}")
    if data_dir is not None:
        for task in tasks:
            reason = why_unavailable(task, data_dir)
            if reason is not None:
                raise GlueError(f"task {task.name}: {reason}; drop it from --tasks or use --tasks available")
    return tasks


def load_splits(task: Task, data_dir: str | os.PathLike | None = None) -> dict[str, datasets.Dataset]:
    """The train split and the validation split(s) of a task, from the hub or from `data_dir`."""
    splits = ("train", *task.validation_splits)
    if data_dir is None:
        try:
            loaded = datasets.load_dataset(HUB_DATASET, task.name)
        except Exception as error:  # offline, no cache, hub changes...: one line whatever the cause
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise GlueError(f"cannot load {task.name} from the hub dataset {HUB_DATASET}: {reason}; "
                            "check the network, or pass a local data directory (--data)") from error
    else:
        files = split_files(task, data_dir)
        missing = missing_files(task, data_dir)
        if missing:
            raise GlueError(f"task {task.name}: missing {', '.join(map(str, missing))}")
        loaded = datasets.load_dataset("parquet", data_files={split: str(path) for split, path in files.items()})
    for split in splits:
        absent = [column for column in (*task.text_columns, "label") if column not in loaded[split].column_names]
        if absent:
            raise GlueError(f"task {task.name}, {split} split: no column {', '.join(absent)} (columns: "
                            f"{', '.join(loaded[split].column_names)}); use the column names of {HUB_DATASET}")
    return {split: loaded[split] for split in splits}


# ---------------------------------------------------------------------------------------------
# Tokenisation
# ---------------------------------------------------------------------------------------------


def prepare_tokenizer(tokenizer: str | os.PathLike | Tokenizer, vocab_size: int, max_length: int) -> Tokenizer:
    """A private copy of the tokenizer set up for GLUE: BERT's pair template, truncation, no padding."""
    try:
        copy = (Tokenizer.from_str(tokenizer.to_str()) if isinstance(tokenizer, Tokenizer)
                else Tokenizer.from_file(str(tokenizer)))
    except Exception as error:  # tokenizers raises a bare Exception for missing or invalid files
        raise GlueError(f"cannot read tokenizer {tokenizer} ({error}); give the checkpoint's tokenizer.json") from error
    if copy.get_vocab_size() != vocab_size:
        name = "the tokenizer" if isinstance(tokenizer, Tokenizer) else f"tokenizer {tokenizer}"
        raise GlueError(f"{name} has {copy.get_vocab_size()} tokens but the model's vocab_size is {vocab_size}; "
                        "use the tokenizer.json the checkpoint was trained with")
    cls, sep = copy.token_to_id("[CLS]"), copy.token_to_id("[SEP]")
    if cls is None or sep is None:
        raise GlueError("tokenizer lacks [CLS] or [SEP]; GLUE inputs are [CLS] A [SEP] B [SEP]")
    # Set here rather than trusted from the file, so any tokenizer with [CLS]/[SEP] encodes alike.
    copy.post_processor = pair_template(copy)
    copy.enable_truncation(max_length)  # counts the special tokens; trims the longer text of a pair first
    copy.no_padding()
    return copy


def pad_id(tokenizer: Tokenizer) -> int:
    found = tokenizer.token_to_id("[PAD]")
    return 0 if found is None else found


@dataclass
class EncodedSplit:
    """One split, tokenised: variable-length rows and their labels."""

    input_ids: list[np.ndarray]
    token_type_ids: list[np.ndarray]
    labels: np.ndarray  # int64 class ids, or float32 scores for regression

    def __len__(self) -> int:
        return len(self.labels)

    def lengths(self) -> np.ndarray:
        return np.fromiter((len(row) for row in self.input_ids), dtype=np.int64, count=len(self))


def encode_split(tokenizer: Tokenizer, task: Task, split: datasets.Dataset) -> EncodedSplit:
    columns = [list(split[column]) for column in task.text_columns]
    inputs = columns[0] if len(columns) == 1 else list(zip(*columns))
    encodings = tokenizer.encode_batch_fast(inputs)  # all cores; skips the offsets we do not need
    labels = np.asarray(split["label"], dtype=np.float32 if task.is_regression else np.int64)
    return EncodedSplit([np.asarray(e.ids, dtype=np.int64) for e in encodings],
                        [np.asarray(e.type_ids, dtype=np.int64) for e in encodings], labels)


def subsample(split: datasets.Dataset, max_rows: int | None, seed: int) -> datasets.Dataset:
    """At most `max_rows` rows drawn without replacement, the same rows for the same seed."""
    if max_rows is None or len(split) <= max_rows:
        return split
    rows = np.random.default_rng(seed).choice(len(split), size=max_rows, replace=False)
    return split.select(np.sort(rows))


# ---------------------------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------------------------


@dataclass
class Batch:
    input_ids: torch.Tensor  # (B, T), T = the longest row of this batch
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    labels: torch.Tensor

    def to(self, device: torch.device) -> Batch:
        return Batch(*(tensor.to(device, non_blocking=True) for tensor in
                       (self.input_ids, self.attention_mask, self.token_type_ids, self.labels)))


def collate(split: EncodedSplit, rows: np.ndarray, pad: int) -> Batch:
    length = max(len(split.input_ids[row]) for row in rows)
    ids = np.full((len(rows), length), pad, dtype=np.int64)
    types = np.zeros((len(rows), length), dtype=np.int64)
    mask = np.zeros((len(rows), length), dtype=np.int64)
    for i, row in enumerate(rows):
        n = len(split.input_ids[row])
        ids[i, :n], types[i, :n], mask[i, :n] = split.input_ids[row], split.token_type_ids[row], 1
    return Batch(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(types),
                 torch.from_numpy(split.labels[rows]))


def batches(split: EncodedSplit, order: np.ndarray, batch_size: int, pad: int) -> Iterator[tuple[np.ndarray, Batch]]:
    """(rows, batch) for consecutive chunks of `order`."""
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        yield rows, collate(split, rows, pad)
