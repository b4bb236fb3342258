"""Cram one architecture: MLM pretraining from scratch under a fixed budget.

    python -m trainer.cram --config trainer/configs/crammed-bert-cpu.yaml --budget 60s --data ../shared/data

This module holds the entry points (`cram`, `cram_with_model`, the CLI `main`) and the
`CramResult`; the training loop itself is `trainer.loop.Trainer`. Neither knows Ray, Optuna or
MLflow: progress goes to a callback (the search wires it to `tune.report`), the result is a
`CramResult`, the checkpoint a directory:
`model.safetensors`, `arch.yaml`, `train.yaml`, `tokenizer.json`, `result.json`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from space.arch import ArchConfig
from space.errors import CramnasError
from trainer import resume
from trainer.budget import Budget
from trainer.checkpoint import CheckpointWriteError, check_writable, save_checkpoint
from trainer.config import RunConfig, TrainConfig, load_run_config
from trainer.console import VERBOSE_HELP, CliParser, ProgressLines, is_terminal, one_line_on_ctrl_c, quiet_libraries
from trainer.corpus import CorpusSource
from trainer.data import PretrainData, prepare_data, tokens_to_prepare
from trainer.data_flags import add_data_arguments
from trainer.device import device_name, pick_device
from trainer.epochs import corpus_tokens, repeat_warning_before
from trainer.loop import OutOfMemory, Progress, Trainer
from trainer.model import CrammedBert
from trainer.regimes import describe_loss, regime
from trainer.rollback import NonFiniteLoss
from trainer.validation import validation_losses


@dataclass
class CramResult:
    validation_loss: float  # MLM loss on the fixed held-out sequences (`validation_loss`)
    unigram_floor: float  # the loss of predicting from train token frequencies alone (trainer/unigram.py)
    nats_below_unigram: float  # unigram_floor - validation_loss
    # The references of trainer/references.py: frequencies plus copying the unchanged tokens (the
    # "learned nothing" line), and a count model that sees the two neighbours.
    corruption_floor: float
    nats_below_floor: float  # corruption_floor - validation_loss: what the model learned beyond copying
    context_reference: float
    validation_loss_by_kind: dict[str, float]  # at [MASK], random and unchanged positions
    regime: str  # one of trainer.references.REGIMES
    tokens: int
    steps: int
    micro_steps: int
    seconds: float  # training wall-clock, what a time budget bounds
    tokens_per_s: float
    params: int
    flops_per_token: float
    device: str
    seed: int
    budget: str
    data_fingerprint: str
    arch_fingerprint: str
    code_version: str
    validation_seconds: float = 0.0  # the held-out evaluation after training
    oom_halvings: int = 0
    final_micro_batch: int = 0
    loss_curve: list[tuple[int, float]] = field(default_factory=list)  # (tokens, train loss)
    validation_curve: list[tuple[int, float]] = field(default_factory=list)  # (tokens, loss): --validate-every
    rollbacks: list[dict] = field(default_factory=list)  # step, tokens, loss, reason, action (trainer/rollback.py)
    epochs: float = 0.0  # tokens trained / training tokens of the corpus: above 1, data was repeated
    compiled: bool = False  # trained through torch.compile (train.compile)
    compile_seconds: float = 0.0  # compiling before the budget clock started: not part of `seconds`
    checkpoint: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def code_version() -> str:
    """The git commit of this checkout (with `+dirty` for local changes), or `unknown`."""
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                              text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5, check=False).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cram(arch: ArchConfig, train: TrainConfig, data: PretrainData, budget: Budget,
         on_progress: Callable[[Progress], None] | None = None, out_dir: str | os.PathLike | None = None,
         device: torch.device | None = None, before_forward: Callable[[int], None] | None = None,
         long_run: resume.LongRun | None = None) -> CramResult:
    """Pretrain `arch` from scratch on `data` until `budget` is spent; optionally write a checkpoint.

    `before_forward` is called with the row count of every forward pass before it runs: fault
    injection (search trials' `oom@N`) raises `torch.OutOfMemoryError` there to drive the halving
    of the micro-batch on machines that have memory to spare. `long_run` (with `out_dir`) adds
    resumable checkpoints in `out_dir/checkpoints/`, a resume, intermediate validation, a stop
    request and the warning that the budget would repeat the corpus (trainer/resume.py)."""
    return cram_with_model(arch, train, data, budget, on_progress, out_dir, device, before_forward, long_run)[1]


def cram_with_model(arch: ArchConfig, train: TrainConfig, data: PretrainData, budget: Budget,
                    on_progress: Callable[[Progress], None] | None = None,
                    out_dir: str | os.PathLike | None = None,
                    device: torch.device | None = None,
                    before_forward: Callable[[int], None] | None = None,
                    long_run: resume.LongRun | None = None) -> tuple[CrammedBert, CramResult]:
    """`cram`, also returning the trained model (eval mode): a search trial probes it in memory."""
    if data.vocab_size != arch.vocab_size or data.seq_len != arch.max_seq_len:
        raise ValueError(f"data: prepared for vocab {data.vocab_size}/seq {data.seq_len} but the architecture "
                         f"has vocab_size {arch.vocab_size}/max_seq_len {arch.max_seq_len}; prepare it again")
    resume_from = long_run.resume_from if long_run is not None else None
    if resume_from is not None:  # before resolving: a checkpoint records the budget as given (180refs)
        resume.check_same_run(resume_from.run, arch, train, budget, data.fingerprint, resume_from.path)
    budget = budget.resolve(arch, train.mlm_rate)  # reference-core seconds become this arch's FLOPs
    device = device or pick_device()
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    trainer = Trainer(arch, train, data, budget, on_progress, device, before_forward, out_dir, long_run)
    if long_run is not None and long_run.warn is not None:
        warning = repeat_warning_before(budget, data, trainer.model, train.mlm_rate, trainer.state.micro_batch, device)
        if warning is not None:
            long_run.warn(warning)
    seconds, tokens_per_s = trainer.run()
    state = trainer.state
    evaluation_start = time.perf_counter()
    held_out_loss, by_kind = validation_losses(trainer.model, data, device)
    result = CramResult(
        validation_loss=held_out_loss, unigram_floor=data.unigram_floor,
        nats_below_unigram=data.unigram_floor - held_out_loss, corruption_floor=data.corruption_floor,
        nats_below_floor=data.corruption_floor - held_out_loss, context_reference=data.context_reference,
        validation_loss_by_kind=by_kind, regime=regime(held_out_loss, data.corruption_floor, data.context_reference),
        validation_seconds=time.perf_counter() - evaluation_start,
        tokens=state.tokens, steps=state.steps, micro_steps=state.micro_steps, seconds=seconds,
        tokens_per_s=tokens_per_s, params=trainer.model.num_params(), flops_per_token=trainer.flops_per_token,
        device=device_name(device), seed=train.seed, budget=budget.text, data_fingerprint=data.fingerprint,
        arch_fingerprint=arch.fingerprint(), code_version=code_version(), oom_halvings=state.oom_halvings,
        final_micro_batch=state.micro_batch, loss_curve=state.loss_curve,
        validation_curve=state.validation_curve, rollbacks=state.rollbacks,
        epochs=state.tokens / corpus_tokens(data), compiled=train.compile, compile_seconds=trainer.compile_seconds,
    )
    if out_dir is not None:
        result.checkpoint = str(Path(out_dir))
        save_checkpoint(out_dir, trainer.model, arch, train, data.tokenizer_path, result.to_dict())
    return trainer.model.eval(), result


@one_line_on_ctrl_c
def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    created: list[Path] = []  # directories the --out check makes: removed again if later input is bad
    try:  # every user error is caught here, before any data is tokenised or any step is taken
        run, train, budget, out, long_run = settle_run(args)
        created = [directory for directory in (out, *out.parents) if not directory.exists()]
        check_writable(out)
        data = prepare_run_data(run, train, budget, long_run.source)
    except CramnasError as error:
        for directory in created:  # deepest first; rmdir leaves anything that is not empty
            with contextlib.suppress(OSError):
                directory.rmdir()
        print(f"error: {error}", file=sys.stderr)
        return 2

    resume_from = long_run.resume_from
    print(f"cramming {run.name} ({run.arch.num_params() / 1e6:.1f}M params) for {budget.text} on "
          f"{device_name(pick_device())}; {len(data.train):,} training sequences"
          + (f"; resuming from {resume_from.path}" if resume_from is not None else ""), flush=True)
    with resume.stop_on_signals(long_run.stop) as received:
        try:
            result = cram_showing_progress(run, train, data, budget, out, long_run)
        except resume.Interrupted as stopped:  # 128 + the signal, as a shell reports a process it ended
            number = received.get("signum", signal.SIGINT)
            print(f"stopped by {signal.Signals(number).name}: checkpoint {stopped.checkpoint}; continue with: "
                  f"python -m trainer.cram --resume {out}", file=sys.stderr)
            return 128 + number
        except resume.ResumeError as error:  # the checkpoint is of another run (`check_same_run`)
            print(f"error: {error}", file=sys.stderr)
            return 2
        except (NonFiniteLoss, OutOfMemory, CheckpointWriteError) as error:  # the run failed: one line, no traceback
            print(f"error: {error}", file=sys.stderr)
            return 1
    print(f"validation MLM loss {result.validation_loss:.4f} after {result.tokens:,} tokens, {result.steps} steps, "
          f"{result.seconds:.1f} s ({result.tokens_per_s:,.0f} tokens/s)")
    print(describe_loss(result.validation_loss, result.unigram_floor, result.corruption_floor, result.context_reference))
    # MLflow is the search layer's (search/record.py): the trainer only writes the run directory.
    print(f"checkpoint: {out}; record it in MLflow with: python -m search.record {out}")
    return 0


def build_parser() -> CliParser:
    """The command line of `python -m trainer.cram` (docs/cli.md is generated from it: docs/gen_cli.py)."""
    parser = CliParser(prog="python -m trainer.cram", description="Cram one architecture under a budget.")
    parser.add_argument("--config", help="run config YAML, e.g. trainer/configs/crammed-bert-cpu.yaml")
    parser.add_argument("--budget", help="60s, 5m, 24h (wall-clock), 2e7tokens, 1e15flops, cramming-day (the compute "
                        "of Cramming's 24 hours on an A6000) or 180refs (seconds of the reference core) (default: 24h)")
    add_data_arguments(parser, data_help="local data directory (DATA/pretrain/<name>/{train,validation}.parquet)")
    parser.add_argument("--out", help="checkpoint directory (default: runs/<config name>-<budget>)")
    parser.add_argument("--seed", type=int, help="overrides train.seed")
    parser.add_argument("--resume", metavar="RUN_DIR", help="continue the run whose --out was RUN_DIR from its "
                        "latest intact checkpoint, with its own config, budget and data")
    parser.add_argument("--checkpoint-every", help="resumable checkpoint cadence in training time or tokens (30m, "
                        "2e8tokens) or off; one is also written at the end and on Ctrl-C/SIGTERM (default: 30m)")
    parser.add_argument("--validate-every", help="validation MLM loss cadence, kept in result.json's "
                        "validation_curve (30m, 2e8tokens) or off (default: 30m)")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    return parser


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    quiet_libraries(args.verbose)
    if not args.config and not args.resume:
        parser.error("--config is required (or --resume RUN_DIR to continue a run)")
    if args.resume and args.out:
        parser.error("--out: a resumed run stays in its --resume directory; leave out --out")
    return args


def warn(line: str) -> None:
    tqdm.write(line, file=sys.stderr)  # above a progress bar, not through it


def settle_run(args: argparse.Namespace) -> tuple[RunConfig, TrainConfig, Budget, Path, resume.LongRun]:
    """The run the arguments ask for, where it goes, and its long-run settings. With --resume, the
    run of the checkpoint, each setting also given on the command line taking its place: a changed
    one is refused (`check_same_run`) by `cram`, once the data's fingerprint is known."""
    resume_from = resume.latest_checkpoint(args.resume, warn) if args.resume else None
    saved = resume_from.run if resume_from is not None else {"source": {}}
    # A resumed run keeps its cadences unless told otherwise.
    every = {flag: vars(args)[flag] or saved["source"].get(flag, "30m") for flag in ("checkpoint_every", "validate_every")}
    checkpoint_every = resume.parse_every(every["checkpoint_every"], "--checkpoint-every")
    validate_every = resume.parse_every(every["validate_every"], "--validate-every")
    run = load_run_config(args.config) if args.config else resume_from.run_config()
    # Report every 1% for the progress bar (the search keeps 1/16: its early-stopping rungs).
    train = dataclasses.replace(run.train, report_every=0.01, seed=run.train.seed if args.seed is None else args.seed)
    budget = Budget.parse(args.budget or saved.get("budget", "24h"))
    out = Path(args.resume or args.out or Path("runs") / f"{run.name}-{budget.text}")
    if resume_from is None:
        resume.check_fresh(out)
    source = saved["source"]  # a resumed run reads the data it was trained on, unless told otherwise
    if args.data or args.corpus:
        source = {"data_dir": args.data and str(Path(args.data).resolve()), "corpus": args.corpus}
    source = {"name": run.name, "data_dir": source.get("data_dir"), "corpus": source.get("corpus"),
              "cache_dir": args.cache_dir or source.get("cache_dir"), **every}
    long_run = resume.LongRun(checkpoint_every, validate_every, resume_from, threading.Event(), warn, source)
    return run, train, budget, out, long_run


def prepare_run_data(run: RunConfig, train: TrainConfig, budget: Budget, source: dict) -> PretrainData:
    # Without --data or --corpus, a GPU streams a corpus it cannot exhaust (trainer/corpus.py),
    # as much of it as a token or FLOP budget trains on.
    corpus = CorpusSource.from_args(data_dir=source["data_dir"], corpus=source["corpus"],
                                    gpu=pick_device().type == "cuda")
    flops_per_token = run.arch.flops_per_token(run.arch.max_seq_len, train.mlm_rate)
    return prepare_data(corpus, vocab_size=run.arch.vocab_size, seq_len=run.arch.max_seq_len,
                        cache_dir=source["cache_dir"], max_tokens=tokens_to_prepare(
                            corpus, budget.resolve(run.arch, train.mlm_rate), flops_per_token))


def cram_showing_progress(run: RunConfig, train: TrainConfig, data: PretrainData, budget: Budget, out: Path,
                          long_run: resume.LongRun) -> CramResult:
    """`cram` with a bar on a terminal; in a log file a plain line every 10% (or 30 s), not one
    endless line of the bar's carriage-return updates."""
    bar = tqdm(total=100, unit="%", bar_format="{l_bar}{bar}| {n:.0f}/{total}% [{elapsed}<{remaining}{postfix}]",
               disable=not is_terminal(sys.stderr))
    lines = ProgressLines(lambda line: print(line, file=sys.stderr, flush=True))

    def show(progress: Progress) -> None:
        if bar.disable:
            lines.update(progress.fraction, f"loss {progress.train_loss:.3f}, {progress.tokens_per_s:,.0f} tokens/s, "
                                            f"{progress.tokens:,} tokens")
            return
        bar.n = round(100 * progress.fraction)
        bar.set_postfix(loss=f"{progress.train_loss:.3f}", tok_s=f"{progress.tokens_per_s:,.0f}",
                        tokens=f"{progress.tokens:,}")

    try:
        result = cram(run.arch, train, data, budget, on_progress=show, out_dir=out, long_run=long_run)
    except BaseException:
        bar.close()  # before the caller's one line
        raise
    # The end of the budget is no progress report (trainer.loop): the bar and the lines stopped short of it.
    bar.n = 100
    bar.close()
    if bar.disable:
        lines.update(1.0, f"{result.tokens:,} tokens")
    return result


if __name__ == "__main__":
    raise SystemExit(main())
