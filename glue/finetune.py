"""Fine-tune a crammed encoder on one GLUE task and score it on the validation split(s).

The head is Cramming's GLUE_sane head: the hidden state of the first token ([CLS]), a dense layer
with tanh, dropout, and a linear layer to the labels (one output for regression, trained with MSE;
else cross-entropy). Cramming's architecture default pools by averaging over tokens, but its
GLUE_sane evaluation overrides that with `pooler: zero_index` (the first token), and that is what
its published GLUE numbers use. Its dense layer is 1024 wide for a 768-wide model; ours is as wide
as the model (BERT's pooler), which suits models of any width. `pooling="mean"` averages the
states of the real tokens instead (padding left out): the probe's choice (see glue.runner).

Optimisation, as Cramming's GLUE_sane: AdamW with betas (0.9, 0.98), eps 1e-6, no weight decay, no
gradient clipping, a cosine schedule after a linear warmup over the first 10% (transformers'
`get_cosine_schedule_with_warmup`), dropout 0.1 everywhere while fine-tuning. The schedule is a
function of the fraction of the run spent: of the planned steps, or of the wall-clock cap when that
comes first (as the cramming loop does with its budget), so a capped run still decays to zero.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from glue.data import EncodedSplit, batches
from glue.tasks import GlueError, Task
from space.arch import ArchConfig
from trainer.device import autocast
from trainer.model import POOLINGS, ClassificationHead, CrammedBert


@dataclass(frozen=True)
class FinetuneSettings:
    """One fine-tuning protocol. The defaults are Cramming's GLUE_sane."""

    epochs: int = 5
    batch_size: int = 16
    lr: float = 4e-5
    warmup: float = 0.1  # fraction of the run
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-6
    weight_decay: float = 0.0
    dropout: float = 0.1
    max_length: int = 128  # tokens, cut further to the model's max_seq_len
    max_train_examples: int | None = None  # None: the whole train split
    max_seconds_per_task: float | None = None  # wall-clock cap on the training of one run (evaluation not included)
    eval_batch_size: int = 128
    pooling: str = "cls"  # or "mean"

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise GlueError(f"pooling {self.pooling!r}: choose {' or '.join(POOLINGS)}")
        for name in ("epochs", "batch_size", "lr", "max_length", "eval_batch_size"):
            if getattr(self, name) <= 0:
                raise GlueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("max_train_examples", "max_seconds_per_task"):  # None: no cap
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise GlueError(f"{name} must be positive (or None for no cap), got {getattr(self, name)}")

    def to_dict(self) -> dict:
        data = asdict(self)
        data["betas"] = list(self.betas)
        return data


SANE = FinetuneSettings()


class SequenceClassifier(nn.Module):
    """encoder -> `ClassificationHead` (first-token or mean state -> dense + tanh -> dropout -> linear)."""

    def __init__(self, encoder: CrammedBert, num_labels: int, dropout: float, pooling: str = "cls"):
        super().__init__()
        self.encoder = encoder
        self.head = ClassificationHead(encoder.arch, num_labels, dropout, pooling)

    def forward(self, input_ids, attention_mask, token_type_ids) -> torch.Tensor:
        return self.head(self.encoder.encode(input_ids, attention_mask, token_type_ids), attention_mask)


def cosine_with_warmup(progress: float, warmup: float) -> float:
    """LR factor at `progress` (fraction of the run done): linear 0 -> 1, then half a cosine to 0."""
    if progress < warmup:
        return progress / warmup
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * (progress - warmup) / (1.0 - warmup))))


@dataclass
class RunResult:
    """One fine-tuning run (one task, one seed)."""

    seed: int
    metrics: dict[str, dict[str, float]]  # entry (e.g. mnli-m) -> metric -> value
    steps: int
    examples_seen: int
    train_seconds: float
    eval_seconds: float
    stopped_by: str  # "epochs" or "time"


def finetune(encoder_state: dict[str, torch.Tensor], arch: ArchConfig, task: Task, train: EncodedSplit,
             validation: dict[str, EncodedSplit], settings: FinetuneSettings, seed: int, pad: int,
             device: torch.device) -> RunResult:
    """Fine-tune a fresh copy of the encoder with a new head; score every validation entry."""
    torch.manual_seed(seed)
    encoder = CrammedBert(arch, dropout=settings.dropout)
    encoder.load_state_dict(encoder_state)
    model = SequenceClassifier(encoder, task.num_labels, settings.dropout, settings.pooling).to(device).train()
    # The encoder's MLM head gets no gradient here; AdamW skips parameters without one.
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.lr, betas=settings.betas, eps=settings.eps,
                                  weight_decay=settings.weight_decay, fused=True)
    planned_steps = settings.epochs * math.ceil(len(train) / settings.batch_size)
    rng = np.random.default_rng(seed)
    steps = seen = 0
    progress = 0.0
    start = time.perf_counter()
    while progress < 1.0:
        for rows, batch in batches(train, rng.permutation(len(train)), settings.batch_size, pad):
            for group in optimizer.param_groups:
                group["lr"] = settings.lr * cosine_with_warmup(progress, settings.warmup)
            batch = batch.to(device)
            with autocast(device):
                logits = model(batch.input_ids, batch.attention_mask, batch.token_type_ids)
            if task.is_regression:
                loss = F.mse_loss(logits.float().squeeze(-1), batch.labels)
            else:
                loss = F.cross_entropy(logits.float(), batch.labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            steps, seen = steps + 1, seen + len(rows)
            progress = steps / planned_steps
            if settings.max_seconds_per_task is not None:
                progress = max(progress, (time.perf_counter() - start) / settings.max_seconds_per_task)
            if progress >= 1.0:
                break
    train_seconds = time.perf_counter() - start
    metrics = {}
    for entry, split in validation.items():
        predictions = predict(model, split, task, settings.eval_batch_size, pad, device)
        metrics[entry] = task.compute_metrics(split.labels, predictions)
    return RunResult(seed, metrics, steps, seen, train_seconds, time.perf_counter() - start - train_seconds,
                     stopped_by="epochs" if steps >= planned_steps else "time")


@torch.inference_mode()
def predict(model: SequenceClassifier, split: EncodedSplit, task: Task, batch_size: int, pad: int,
            device: torch.device) -> np.ndarray:
    """Class ids, or scores for regression, for every row of `split` (in its order)."""
    model.eval()
    predictions = np.empty(len(split), dtype=np.float32 if task.is_regression else np.int64)
    # Rows of similar length share a batch, so that little of it is padding.
    for rows, batch in batches(split, np.argsort(split.lengths(), kind="stable"), batch_size, pad):
        batch = batch.to(device)
        with autocast(device):
            logits = model(batch.input_ids, batch.attention_mask, batch.token_type_ids).float()
        out = logits.squeeze(-1) if task.is_regression else logits.argmax(-1)
        predictions[rows] = out.cpu().numpy()
    model.train()
    # A diverged run predicts NaN scores: count them as 0 (no information) rather than fail.
    return np.nan_to_num(predictions) if task.is_regression else predictions
