"""Resumable training state: what `python -m trainer.cram --resume runs/<name>` continues from.

    runs/<name>/checkpoints/step-00001200/  model.safetensors  optimizer.safetensors  state.json

`state.json` holds the run (arch, train, budget, data fingerprint, data source), the loop's progress
between two optimizer steps (budget spent, data position, loss and validation curves, rollbacks,
LR schedule position through the budget fraction) and the RNG states (torch, CUDA, the masking
generator, numpy, python), and the size and SHA-256 of the two weight files. A checkpoint is built
under a temporary name, every file synced, then renamed into place (`trainer.atomic`): a directory
named `step-*` is complete. These are the resumable checkpoints; the final one, which other tools
read, is trainer/checkpoint.py's. The newest one and the one before are kept. On resume, a checkpoint that does not
match its record (a damaged disk, a copy cut short) is refused with one line and the one before
it is used.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import math
import random
import shutil
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, load_model, save_file

from space.arch import ArchConfig
from trainer.atomic import atomic_directory
from trainer.budget import Budget, BudgetError
from trainer.checkpoint import CheckpointWriteError, safetensors_os_errors, save_weights
from trainer.config import ConfigError, RunConfig, TrainConfig

FORMAT_VERSION = 1
CHECKPOINTS = "checkpoints"
STATE = "state.json"


class ResumeError(ConfigError):
    """No usable checkpoint, or one of another run: one line naming what and the fix."""


class Interrupted(RuntimeError):
    """A stop was requested (Ctrl-C, SIGTERM); `checkpoint` is where training can resume from."""

    def __init__(self, checkpoint: Path | None):
        super().__init__(f"interrupted; checkpoint: {checkpoint}" if checkpoint else "interrupted; no checkpoint")
        self.checkpoint = checkpoint


@dataclass
class LongRun:
    """What a long cram adds to the loop (`trainer.cram`'s CLI sets it; a search trial does not)."""

    checkpoint_every: Budget | None = None  # periodic resumable checkpoints (one is also written at the end)
    validate_every: Budget | None = None  # validation MLM loss appended to CramResult.validation_curve
    resume_from: Checkpoint | None = None
    stop: threading.Event | None = None  # set by a signal handler: checkpoint and raise `Interrupted`
    warn: Callable[[str], None] | None = None  # the warning that the budget would repeat the corpus
    source: dict = field(default_factory=dict)  # the data source, recorded so --resume can find it again


@contextlib.contextmanager
def stop_on_signals(stop: threading.Event) -> Iterator[dict]:
    """Ctrl-C and SIGTERM (a scheduler's preemption) set `stop`: the loop checkpoints and raises
    `Interrupted`. A second signal acts as it did before (Ctrl-C: KeyboardInterrupt; SIGTERM: the
    process ends). Yields a dict that gets `signum`, the signal received."""
    received: dict = {}

    def handler(signum, frame):
        received["signum"] = signum
        stop.set()
        signal.signal(signum, previous[signum])

    previous = {number: signal.signal(number, handler) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for number, action in previous.items():
            signal.signal(number, action)


def run_record(arch: ArchConfig, train: TrainConfig, budget: Budget, data_fingerprint: str) -> dict:
    """What makes two runs the same run: a resumed one must match it (`check_same_run`)."""
    return {"arch": arch.to_dict(), "train": train.to_dict(), "budget": budget.text,
            "data_fingerprint": data_fingerprint}


def parse_every(text: str, flag: str) -> Budget | None:
    """`--checkpoint-every`/`--validate-every`: an amount of training like a budget (30m, 2e6tokens), or off."""
    if str(text).strip().lower() == "off":
        return None
    try:
        every = Budget.parse(text)
    except BudgetError as error:
        raise BudgetError(f"{flag}: {str(error).removeprefix('budget: ')} (or off)") from None
    if every.is_reference_core:  # a cadence is counted in the loop, which sees no reference core
        raise BudgetError(f"{flag}: {every.text} is reference-core seconds, a budget's unit only; write e.g. 30m, "
                          "2e6tokens or 1e12flops (or off)")
    return every


class Cadence:
    """Fires each time training crosses another multiple of `every` (never when it is None)."""

    def __init__(self, every: Budget | None, seconds: float, tokens: int, flops: float):
        self.every = every
        self.mark = math.floor(every.fraction(seconds, tokens, flops)) + 1 if every else math.inf

    def due(self, seconds: float, tokens: int, flops: float) -> bool:
        if self.every is None:
            return False
        spent = self.every.fraction(seconds, tokens, flops)
        if spent < self.mark:
            return False
        self.mark = math.floor(spent) + 1
        return True


# ---- RNG states --------------------------------------------------------------------------------

def capture_rng(masking: torch.Generator) -> dict:
    """The random states the loop draws from, as they are now: taken at every step, so ~10 us.
    numpy's and python's, which it never draws from (and which take 0.2 ms), are added by
    `save_resumable`."""
    return {"torch": torch.get_rng_state(), "masking": masking.get_state(), "cuda": _cuda_rng_states()}


def _cuda_rng_states() -> list[torch.Tensor]:
    """The CUDA generators' states, when this process uses CUDA. Asking for them initialises CUDA,
    and `is_available` is true on any GPU host: a CPU run there would create a CUDA context on GPU 0
    (hundreds of MB, beside the trials Ray placed on it) at its first step. A process that never
    initialised CUDA never drew from its generators."""
    return torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []


def restore_rng(masking: torch.Generator, states: dict) -> None:
    torch.set_rng_state(states["torch"])
    masking.set_state(states["masking"])
    if states["cuda"] and torch.cuda.is_initialized():  # a run on the GPU has moved its model there by now
        torch.cuda.set_rng_state_all(states["cuda"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])


def _encode_rng(states: dict) -> dict:
    def b64(tensor: torch.Tensor) -> str:
        return base64.b64encode(tensor.numpy().tobytes()).decode()

    name, key, pos, has_gauss, gauss = states["numpy"]
    version, internal, gauss_next = states["python"]
    return {"torch": b64(states["torch"]), "masking": b64(states["masking"]),
            "cuda": [b64(state) for state in states["cuda"]],
            "numpy": [name, key.tolist(), pos, has_gauss, gauss], "python": [version, list(internal), gauss_next]}


def _decode_rng(states: dict) -> dict:
    def tensor(text: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8)

    name, key, pos, has_gauss, gauss = states["numpy"]
    version, internal, gauss_next = states["python"]
    return {"torch": tensor(states["torch"]), "masking": tensor(states["masking"]),
            "cuda": [tensor(state) for state in states["cuda"]],
            "numpy": (name, np.array(key, dtype=np.uint32), pos, has_gauss, gauss),
            "python": (version, tuple(internal), gauss_next)}


# ---- writing -----------------------------------------------------------------------------------

def _sha256(path: Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def save_resumable(run_dir: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, run: dict,
                   progress: dict, keep: Path | None = None) -> Path:
    """Write the resumable checkpoint `run_dir/checkpoints/step-<steps>/` atomically; remove every
    other checkpoint but `keep` (the previous one). `progress` is the loop's state with its raw RNG
    states (`trainer.loop.Trainer.snapshot`)."""
    root = Path(run_dir) / CHECKPOINTS
    final = root / f"step-{progress['steps']:08d}"
    optimizer_state = optimizer.state_dict()
    tensors = {f"{index}.{key}": value.detach().to("cpu").contiguous()
               for index, values in optimizer_state["state"].items() for key, value in values.items()}
    state = {"format": FORMAT_VERSION, "run": run,
             "progress": {**progress, "rng": _encode_rng({**progress["rng"], "numpy": np.random.get_state(),
                                                          "python": random.getstate()})},
             "param_groups": optimizer_state["param_groups"]}
    writers = {"model.safetensors": lambda path: save_weights(model, path),
               "optimizer.safetensors": lambda path: save_file(tensors, str(path))}
    current = final  # named in the error: where the file that failed would have been
    try:
        # "replace": a second checkpoint at the same step (interrupted right after a periodic one)
        with atomic_directory(final, if_exists="replace") as staged:
            for file, write in writers.items():
                current = final / file
                with safetensors_os_errors():
                    staged.write(file, write)
            state["files"] = {file: {"bytes": staged.path(file).stat().st_size, "sha256": _sha256(staged.path(file))}
                              for file in writers}
            current = final / STATE  # last: a directory whose state.json reads holds every file it describes
            staged.write(STATE, lambda path: path.write_text(json.dumps(state, indent=1)))
    except OSError as error:
        with contextlib.suppress(OSError):
            root.rmdir()  # when nothing else is in it
        raise CheckpointWriteError(f"checkpoint write failed: {error.strerror or error} ({current})") from error
    for entry in root.iterdir():  # older checkpoints, refused ones and what killed writers left
        if entry not in (final, keep):
            shutil.rmtree(entry, ignore_errors=True)
    return final


# ---- reading -----------------------------------------------------------------------------------

@dataclass
class Checkpoint:
    """A checkpoint directory that matched its record when it was read."""

    path: Path
    state: dict

    @property
    def run(self) -> dict:
        """`run_record` plus `source`: the run config's name and the data source (--data/--corpus)."""
        return self.state["run"]

    def run_config(self) -> RunConfig:
        return RunConfig(self.run["source"].get("name", self.path.parent.parent.name),
                         ArchConfig.from_dict(self.run["arch"]), TrainConfig.from_dict(self.run["train"]))

    def progress(self) -> dict:
        """The loop's state (`trainer.loop.LoopState.to_dict`), with RNG states ready for `restore_rng`."""
        progress = dict(self.state["progress"])
        progress["rng"] = _decode_rng(progress["rng"])
        return progress

    def load_into(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        load_model(model, str(self.path / "model.safetensors"))
        state: dict[int, dict] = {}
        for name, tensor in load_file(str(self.path / "optimizer.safetensors")).items():
            index, key = name.split(".", 1)
            state.setdefault(int(index), {})[key] = tensor
        # JSON has no tuples: AdamW's betas come back as one.
        groups = [{key: tuple(value) if key == "betas" else value for key, value in group.items()}
                  for group in self.state["param_groups"]]
        optimizer.load_state_dict({"state": state, "param_groups": groups})


def _damage(path: Path) -> str | None:
    """Why this checkpoint directory cannot be trusted, or None."""
    try:
        state = json.loads((path / STATE).read_text())
    except (OSError, ValueError) as error:
        return f"{STATE} unreadable ({type(error).__name__})"
    if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION or not isinstance(state.get("files"), dict):
        return f"{STATE} is not a format-{FORMAT_VERSION} checkpoint record"
    for file, expected in state["files"].items():
        target = path / file
        if not target.is_file():
            return f"{file} missing"
        if target.stat().st_size != expected["bytes"]:
            return f"{file} has {target.stat().st_size} bytes, {expected['bytes']} expected"
        if _sha256(target) != expected["sha256"]:
            return f"{file} does not match its checksum"
    return None


def check_fresh(out: Path) -> None:
    """A new run must not start over the checkpoints of another one."""
    if checkpoint_dirs(out):
        raise ResumeError(f"--out: {out} holds the checkpoints of a run; continue it with --resume {out} "
                          "or choose another --out")


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """The complete-by-name checkpoint directories of a run, oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    return sorted(root.glob("step-*")) if root.is_dir() else []


def latest_checkpoint(run_dir: str | Path, warn: Callable[[str], None]) -> Checkpoint:
    """The newest checkpoint of `run_dir` that matches its record; each refused one is one `warn` line."""
    candidates = checkpoint_dirs(run_dir)
    if not candidates:
        raise ResumeError(f"--resume: {run_dir} holds no checkpoints ({Path(run_dir) / CHECKPOINTS}/step-*); "
                          "pass the --out directory of a run started by trainer.cram")
    for path in reversed(candidates):
        damage = _damage(path)
        if damage is None:
            return Checkpoint(path, json.loads((path / STATE).read_text()))
        warn(f"warning: refusing checkpoint {path}: {damage}; trying the one before")
    raise ResumeError(f"--resume: no intact checkpoint in {Path(run_dir) / CHECKPOINTS}; start the run again")


def check_same_run(saved: dict, arch: ArchConfig, train: TrainConfig, budget: Budget, data_fingerprint: str,
                   where: Path) -> None:
    """One line naming the first setting in which this run (arch, train, budget as given, not yet
    resolved, and data fingerprint) differs from the run `saved` at checkpoint `where` (its
    `run_record`): a resumed run must be the same run."""
    fix = "resume with the run's own settings (leave out --config, --budget, --seed, --data) or start a new --out"
    current = run_record(arch, train, budget, data_fingerprint)
    # A run saved before an architecture field existed was trained with the field's default.
    saved = {**saved, "arch": {**ArchConfig().to_dict(), **saved["arch"]}}
    for section in ("arch", "train"):
        for key in sorted(set(saved[section]) | set(current[section])):
            was, now = saved[section].get(key), current[section].get(key)
            if was != now:
                raise ResumeError(f"--resume: {section}.{key} is {now!r} but {where} was trained with {was!r}; {fix}")
    was = Budget.parse(saved["budget"])  # the record's text; this run's budget is compared as it came
    if (was.kind, was.amount) != (budget.kind, budget.amount):
        raise ResumeError(f"--resume: budget is {budget.text} but {where} was trained for {was.text}; {fix}")
    if saved["data_fingerprint"] != current["data_fingerprint"]:
        raise ResumeError(f"--resume: the data (fingerprint {current['data_fingerprint']}) is not the data {where} "
                          f"was trained on ({saved['data_fingerprint']}); {fix}")
