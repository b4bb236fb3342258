"""GPU check: crammed-bert training throughput and MFU, eager against torch.compile.

    bash benchmarks/gpu_check.sh              # on a GPU: crammed-bert (16 layers, 768 hidden), bf16
    bash benchmarks/gpu_check.sh --dry-run    # anywhere: a tiny model on CPU, same code path

Each variant runs the trainer's own loop (`trainer.loop.Trainer`: masking on the device, copies,
forward, backward, clipping, fused AdamW; 25% of tokens predicted at fixed positions) as the GPU
profile's trials do (search/profiles/gpu.yaml: micro-batches of 256, 6 per optimizer step, the
whole batch from the first step) on random token ids (throughput does not depend on the text):
`--steps` steps compiled, `--eager-steps` eager for the speed-up, after `--warmup` eager steps that
start CUDA. The rollback guard judges every step but keeps no snapshot (max_rollbacks 0): its copy
of the model and optimizer to the host, every 100 steps in a trial, is not the step's speed. The
last step runs under `torch.cuda.set_sync_debug_mode("warn")`: the host waits it prints are the
step's syncs (one is meant: the loss the guard reads). MFU = tokens/s x training FLOPs per token
(ArchConfig.flops_per_token) / peak, against two peaks: the bf16 matmul rate this device achieves,
measured first (large square matmuls), and the datasheet's dense bf16 peak (989 TFLOP/s for
H100/H200 SXM). Compiling happens before the trainer's clock starts, as in a trial; its seconds are
printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import yaml

from trainer.budget import Budget
from trainer.config import load_run_config
from trainer.data import PretrainData
from trainer.device import device_name, pick_device
from trainer.loop import Trainer

DATASHEET_PEAK_FLOPS = 989e12  # H100/H200 SXM, dense bf16 (no sparsity)
CONFIG = Path(__file__).resolve().parents[1] / "trainer" / "configs" / "crammed-bert.yaml"
PROFILE = Path(__file__).resolve().parents[1] / "search" / "profiles" / "gpu.yaml"
SPECIALS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}


def matmul_rate(device: torch.device, size: int, repeats: int) -> float:
    """FLOP/s of a size x size matmul in the precision training uses (bf16 on GPUs, fp32 on CPU):
    the achievable peak MFU is read against."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    if device.type == "cuda":
        torch.cuda.synchronize()
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def synthetic_data(arch, rows: int) -> PretrainData:
    """Random token rows in `PretrainData`'s form: the trainer's step does not depend on the text."""
    generator = np.random.default_rng(0)
    train = generator.integers(5, arch.vocab_size, (rows, arch.max_seq_len), dtype=np.uint16)
    return PretrainData(train=train, validation=train[:8], tokenizer=None, tokenizer_path=None, fingerprint="synthetic",
                        seq_len=arch.max_seq_len, vocab_size=arch.vocab_size, special_ids=SPECIALS,
                        manifest={"unigram_floor": float("nan")}, from_cache=False)


def measure(arch, train, device, steps: int, compile_model: bool, sync_debug: bool = False) -> tuple[float, float]:
    """Tokens/s of the trainer's own loop (`trainer.loop.Trainer`: masking on the device, copies,
    gradient clipping, the rollback guard, fused AdamW) over `steps` optimizer steps of `train`'s
    batch, and the seconds compiling took before its clock started. `sync_debug`: the last step
    runs under CUDA's sync debug mode, its warnings printed."""
    train = dataclasses.replace(train, compile=compile_model, report_every=1.0, batch_ramp=0.0, max_rollbacks=0)
    data = synthetic_data(arch, train.batch_size * (steps + 1))
    budget = Budget("tokens", steps * train.batch_size * arch.max_seq_len, f"{steps} steps")
    last_step = (steps - 1) * -(-train.batch_size // train.micro_batch)  # micro-batches before the last step

    def before_forward(rows: int) -> None:
        if sync_debug and trainer.state.micro_steps == last_step:
            torch.cuda.set_sync_debug_mode("warn")

    trainer = Trainer(arch, train, data, budget, None, device, before_forward=before_forward)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _, tokens_per_s = trainer.run()
    if sync_debug:
        torch.cuda.set_sync_debug_mode("default")
        syncs = [str(warning.message).splitlines()[0] for warning in seen if "synchroniz" in str(warning.message)]
        print(f"sync debug, last step: {len(syncs)} host waits" + "".join(f"\n  {line}" for line in syncs))
    return tokens_per_s, trainer.compile_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny model on CPU: checks the code path")
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps of the compiled loop")
    parser.add_argument("--eager-steps", type=int, default=20, help="optimizer steps of the eager loop")
    parser.add_argument("--eager", action="store_true", help="no compiled loop: --steps steps eager "
                        "(gpu_session.sh, when its compile preflight fails)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--matmul-size", type=int, default=8192)
    args = parser.parse_args()

    run = load_run_config(CONFIG)
    arch = run.arch
    train = dataclasses.replace(run.train, **yaml.safe_load(PROFILE.read_text())["train"])  # the profile's batch
    device = pick_device()
    if args.dry_run:
        arch = arch.replace(layers=2, hidden=64, heads=4, vocab_size=512)
        train = dataclasses.replace(train, micro_batch=4, batch_size=24)  # 6 micro-batches, as the profile's
        device, args.steps, args.eager_steps, args.warmup, args.matmul_size = torch.device("cpu"), 3, 2, 1, 256
    elif device.type != "cuda":
        raise SystemExit("gpu_check: no CUDA device; use --dry-run to check the code path on CPU")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    per_token = arch.flops_per_token(arch.max_seq_len, train.mlm_rate)
    print(f"device={device_name(device)} layers={arch.layers} hidden={arch.hidden} params={arch.num_params() / 1e6:.1f}M "
          f"seq={arch.max_seq_len} micro_batch={train.micro_batch} x {train.batch_size // train.micro_batch} per step "
          f"dtype={'bf16' if device.type == 'cuda' else 'fp32'} flops/token={per_token:.3g}")
    achievable = matmul_rate(device, args.matmul_size, repeats=20 if device.type == "cuda" else 3)
    print(f"matmul achievable={achievable / 1e12:.3g} TFLOP/s datasheet={DATASHEET_PEAK_FLOPS / 1e12:.0f} TFLOP/s "
          f"(size {args.matmul_size})")
    measure(arch, train, device, args.warmup, compile_model=False)  # CUDA context, cuBLAS
    runs = [(False, args.steps)] if args.eager else [(False, args.eager_steps), (True, args.steps)]
    rates, compile_seconds = {}, {}
    for compile_model, steps in runs:
        last = compile_model or args.eager  # the long run's last step is the one under sync debug
        rates[compile_model], compile_seconds[compile_model] = measure(
            arch, train, device, steps, compile_model, sync_debug=last and device.type == "cuda")
        flops = rates[compile_model] * per_token
        print(f"compile={compile_model} steps={steps} tokens/s={rates[compile_model]:,.0f} "
              f"MFU={100 * flops / achievable:.1f}% of achievable, {100 * flops / DATASHEET_PEAK_FLOPS:.1f}% of datasheet")
    if not args.eager:
        print(f"compile speed-up={rates[True] / rates[False]:.2f}x compile seconds={compile_seconds[True]:.1f}")


if __name__ == "__main__":
    main()
