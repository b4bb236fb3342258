"""A frozen-feature linear probe: what a crammed encoder's representations hold, with no fine-tuning.

    from glue.linear_probe import linear_probe
    result = linear_probe("runs/crammed-bert-cpu-60s", data_dir="../shared/data")   # a checkpoint directory
    result = linear_probe(model, tokenizer_path, tasks=("sst2", "rte"))              # an in-memory CrammedBert
    result.average, result.scores, result.to_dict()

Each task's training examples (at most `max_train_examples`, drawn by `seed`) and its full
validation split(s) go through the encoder once, frozen (eval mode, no gradients). An example's
feature vector is the mean of the final hidden states of its real tokens (padding left out), the
input laid out as for fine-tuning: [CLS] A [SEP] (B [SEP]). The features are standardised on the
training set, then scikit-learn fits a linear model on them: L2 logistic regression for a
classification task, its C picked from C_GRID by 5-fold cross-validation on the training examples;
ridge regression for STS-B, its alpha picked from ALPHA_GRID by leave-one-out. The validation
predictions are scored with the official GLUE metrics of glue.tasks.

Why beside the fine-tuning probe (glue.probe): seconds of fine-tuning move every weight of the
encoder, so a random encoder can learn as much in them as a crammed one, and at CPU scale the two
score alike. A frozen probe asks only what pretraining put into the features, with a regulariser
chosen on the training data, so the score depends on the encoder and the seed's subset alone
(no clock, no optimiser noise).

Bad input (an unknown task, missing data, a checkpoint that does not load, a tokenizer of the
wrong size, too few examples of a class) fails in one line before any example is encoded.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import numpy as np
import torch
from sklearn.linear_model import LogisticRegressionCV, RidgeCV
from sklearn.preprocessing import StandardScaler
from tokenizers import Tokenizer

from glue.data import EncodedSplit, batches, encode_split, load_splits, pad_id, prepare_tokenizer, resolve_tasks, subsample
from glue.finetune import SANE
from glue.tasks import GlueError, Task, describe_average, glue_average
from trainer.checkpoint import load_checkpoint
from trainer.config import ConfigError
from trainer.device import autocast, device_name

DEFAULT_TASKS = ("sst2", "rte", "stsb")
# Inverse regularisation strengths for logistic regression, and ridge penalties: a small fixed
# grid, so that every encoder is probed with the same choices and the choice stays cheap.
C_GRID = (0.01, 0.1, 1.0, 10.0)
ALPHA_GRID = (0.1, 1.0, 10.0, 100.0, 1000.0)
CV_FOLDS = 5
BATCH_SIZE = 128  # encoding only: no gradients, so a batch costs little memory


@dataclass
class LinearProbeResult:
    """Scores of one frozen encoder. Metric values are fractions (accuracy 0.58, not 58)."""

    tasks: list[str]
    metrics: dict[str, dict[str, float]]  # entry -> metric -> value
    scores: dict[str, float]  # entry -> main score (glue.tasks)
    average: float  # mean of `scores`
    average_over: str  # which entries the average covers, in words
    regularisation: dict[str, float]  # task -> the C (classification) or alpha (regression) chosen
    train_examples: dict[str, int]  # task -> training examples the linear model was fitted on
    feature_size: int
    seed: int
    seconds: dict[str, float]  # task -> encoding and fitting; "total" includes loading the data
    device: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Prepared:
    task: Task
    train: EncodedSplit
    validation: dict[str, EncodedSplit]  # entry -> split


def linear_probe(model: torch.nn.Module | str | os.PathLike, tokenizer_path: str | os.PathLike | Tokenizer | None = None,
                 tasks: str | Iterable[str] = DEFAULT_TASKS, *, data_dir: str | os.PathLike | None = None,
                 max_train_examples: int | None = 4000, seed: int = 0,
                 device: torch.device | str | None = None) -> LinearProbeResult:
    """Fit a linear model on the frozen, mean-pooled features of `model` for each task; score it.

    `model`: a checkpoint directory written by trainer.cram (its tokenizer.json is used unless
    `tokenizer_path` is given), or an in-memory encoder with its tokenizer: a CrammedBert, or any
    module with CrammedBert's `arch` and `encode(input_ids, attention_mask, token_type_ids)`.
    `device`: where to encode (default: where the model's weights are). The caller's model is
    left as it was: same weights, same train/eval mode, same device.
    """
    start = time.perf_counter()
    if max_train_examples is not None and max_train_examples <= 0:
        raise GlueError(f"max_train_examples must be positive (or None for the whole train split), got {max_train_examples}")
    resolved = resolve_tasks(tasks, data_dir)  # unknown or missing tasks fail before the model loads
    encoder, tokenizer = _load(model, tokenizer_path)
    tokenizer = prepare_tokenizer(tokenizer, encoder.arch.vocab_size, min(SANE.max_length, encoder.arch.max_seq_len))
    prepared = [_prepare(task, tokenizer, data_dir, max_train_examples, seed) for task in resolved]
    pad = pad_id(tokenizer)
    encoder, where = _placed(encoder, device)

    metrics, scores, regularisation, seconds = {}, {}, {}, {}
    was_training = encoder.training
    encoder.eval()  # no dropout: the features of an example are the same every time
    try:
        for item in prepared:
            task_start = time.perf_counter()
            train_features = pooled_features(encoder, item.train, pad, where)
            validation_features = {entry: pooled_features(encoder, split, pad, where)
                                   for entry, split in item.validation.items()}
            predictions, regularisation[item.task.name] = fit_and_predict(
                item.task, train_features, item.train.labels, validation_features)
            for entry, split in item.validation.items():
                metrics[entry] = item.task.compute_metrics(split.labels, predictions[entry])
                scores[entry] = metrics[entry][item.task.main_metric]
            seconds[item.task.name] = time.perf_counter() - task_start
    finally:
        encoder.train(was_training)
    seconds["total"] = time.perf_counter() - start
    return LinearProbeResult(
        tasks=[task.name for task in resolved], metrics=metrics, scores=scores, average=glue_average(scores),
        average_over=describe_average(scores), regularisation=regularisation,
        train_examples={item.task.name: len(item.train) for item in prepared}, feature_size=encoder.arch.hidden,
        seed=seed, seconds=seconds, device=device_name(where),
    )


def _load(model, tokenizer_path) -> tuple[torch.nn.Module, str | os.PathLike | Tokenizer]:
    """(encoder, tokenizer) from a checkpoint directory, or an in-memory encoder and its tokenizer."""
    if isinstance(model, (str, os.PathLike)):
        try:
            encoder, saved_tokenizer = load_checkpoint(model)
        except ConfigError as error:
            raise GlueError(str(error)) from None
        return encoder, tokenizer_path if tokenizer_path is not None else saved_tokenizer
    if not (isinstance(model, torch.nn.Module) and hasattr(model, "encode") and hasattr(model, "arch")):
        raise GlueError(f"model: expected a checkpoint directory or a CrammedBert, got {type(model).__name__}")
    if tokenizer_path is None:
        raise GlueError("tokenizer_path: an in-memory model needs its tokenizer: linear_probe(model, tokenizer_json_path)")
    return model, tokenizer_path


def _prepare(task: Task, tokenizer: Tokenizer, data_dir, max_train_examples: int | None, seed: int) -> _Prepared:
    """Load and tokenise one task, and check it can be cross-validated: all before any encoding."""
    splits = load_splits(task, data_dir)
    train = encode_split(tokenizer, task, subsample(splits["train"], max_train_examples, seed))
    if not task.is_regression:
        counts = np.bincount(train.labels, minlength=task.num_labels)
        if counts.min() < CV_FOLDS:
            raise GlueError(f"task {task.name}: {len(train)} training examples hold {counts.min()} of some class, fewer "
                            f"than the {CV_FOLDS} cross-validation folds; raise max_train_examples")
    elif len(train) < 2:
        raise GlueError(f"task {task.name}: {len(train)} training example(s); ridge regression needs 2 or more")
    return _Prepared(task, train, {entry: encode_split(tokenizer, task, splits[split]) for entry, split in task.entries})


def _placed(encoder: torch.nn.Module, device: torch.device | str | None) -> tuple[torch.nn.Module, torch.device]:
    """The encoder on `device`: itself when it is there already, else a copy (the caller's stays put)."""
    weight = next(encoder.parameters(), None)
    here = weight.device if weight is not None else torch.device("cpu")
    where = here if device is None else torch.device(device)
    if where == here:
        return encoder, where
    return copy.deepcopy(encoder).to(where), where


@torch.no_grad()
def pooled_features(encoder: torch.nn.Module, split: EncodedSplit, pad: int, device: torch.device,
                    batch_size: int = BATCH_SIZE) -> np.ndarray:
    """(rows, hidden) float64: the mean final hidden state over each row's real tokens."""
    features = np.empty((len(split), encoder.arch.hidden), dtype=np.float64)
    # Rows of similar length share a batch, so that little of it is padding.
    for rows, batch in batches(split, np.argsort(split.lengths(), kind="stable"), batch_size, pad):
        batch = batch.to(device)
        with autocast(device):
            hidden = encoder.encode(batch.input_ids, batch.attention_mask, batch.token_type_ids)
        keep = batch.attention_mask.unsqueeze(-1).to(torch.float32)
        features[rows] = ((hidden.float() * keep).sum(1) / keep.sum(1)).cpu().numpy()
    # A diverged encoder's NaN or inf states carry no information: zeros, not a failed fit.
    return np.nan_to_num(features, nan=0.0, posinf=0.0, neginf=0.0)


def fit_and_predict(task: Task, train_features: np.ndarray, train_labels: np.ndarray,
                    validation_features: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
    """Standardise on train, fit the task's linear model, predict every validation entry.
    Returns (entry -> predictions, the C or alpha that cross-validation chose)."""
    scaler = StandardScaler().fit(train_features)  # a constant feature keeps scale 1: no division by zero
    train_x = scaler.transform(train_features)
    if task.is_regression:
        model = RidgeCV(alphas=ALPHA_GRID).fit(train_x, train_labels)  # leave-one-out, in closed form
        chosen = float(model.alpha_)
    else:
        # Log loss, not accuracy, picks C: on a few thousand examples neighbouring Cs often tie in
        # accuracy, while the log loss still tells them apart. L2 only (l1_ratios 0).
        model = LogisticRegressionCV(Cs=list(C_GRID), cv=CV_FOLDS, l1_ratios=(0.0,), scoring="neg_log_loss",
                                     max_iter=1000, use_legacy_attributes=False).fit(train_x, train_labels)
        chosen = float(model.C_)
    predictions = {entry: model.predict(scaler.transform(features)) for entry, features in validation_features.items()}
    return predictions, chosen
