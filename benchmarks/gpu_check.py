"""GPU check: crammed-bert training throughput and MFU, eager against torch.compile.

    bash benchmarks/gpu_check.sh              # on a GPU: crammed-bert (16 layers, 768 hidden), bf16
    bash benchmarks/gpu_check.sh --dry-run    # anywhere: a tiny model on CPU, same code path

Each variant runs the trainer's own loop (`trainer.loop.Trainer`: masking on the device, copies,
forward, backward, clipping, fused AdamW; 25% of tokens predicted at fixed positions) for `--steps`
optimizer steps of one micro-batch on random token ids (throughput does not depend on the text),
after `--warmup` eager steps that start CUDA. MFU = tokens/s x training FLOPs per token
(ArchConfig.flops_per_token) / peak, against two peaks: the bf16 matmul rate this device achieves,
measured first (large square matmuls), and the datasheet's dense bf16 peak (989 TFLOP/s for
H100/H200 SXM). Compiling happens before the trainer's clock starts, as in a trial; its seconds are
printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import numpy as np
import torch

from trainer.budget import Budget
from trainer.config import load_run_config
from trainer.data import PretrainData
from trainer.device import device_name, pick_device
from trainer.loop import Trainer

DATASHEET_PEAK_FLOPS = 989e12  # H100/H200 SXM, dense bf16 (no sparsity)
CONFIG = Path(__file__).resolve().parents[1] / "trainer" / "configs" / "crammed-bert.yaml"
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


def measure(arch, train, device, micro_batch: int, steps: int, compile_model: bool) -> tuple[float, float]:
    """Tokens/s of the trainer's own loop (`trainer.loop.Trainer`: masking on the device, copies,
    gradient clipping, the rollback guard, fused AdamW) over `steps` optimizer steps of one
    micro-batch each, and the seconds compiling took before its clock started."""
    train = dataclasses.replace(train, micro_batch=micro_batch, batch_size=micro_batch, compile=compile_model,
                                report_every=1.0)
    data = synthetic_data(arch, micro_batch * (steps + 1))
    budget = Budget("tokens", steps * micro_batch * arch.max_seq_len, f"{steps} steps")
    trainer = Trainer(arch, train, data, budget, None, device)
    _, tokens_per_s = trainer.run()
    return tokens_per_s, trainer.compile_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny model on CPU: checks the code path")
    parser.add_argument("--micro-batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--matmul-size", type=int, default=8192)
    args = parser.parse_args()

    run = load_run_config(CONFIG)
    arch, train = run.arch, run.train
    device = pick_device()
    if args.dry_run:
        arch = arch.replace(layers=2, hidden=64, heads=4, vocab_size=512)
        device, args.micro_batch, args.steps, args.warmup, args.matmul_size = torch.device("cpu"), 4, 2, 1, 256
    elif device.type != "cuda":
        raise SystemExit("gpu_check: no CUDA device; use --dry-run to check the code path on CPU")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    per_token = arch.flops_per_token(arch.max_seq_len, train.mlm_rate)
    print(f"device={device_name(device)} layers={arch.layers} hidden={arch.hidden} params={arch.num_params() / 1e6:.1f}M "
          f"seq={arch.max_seq_len} micro_batch={args.micro_batch} dtype={'bf16' if device.type == 'cuda' else 'fp32'} "
          f"flops/token={per_token:.3g}")
    achievable = matmul_rate(device, args.matmul_size, repeats=20 if device.type == "cuda" else 3)
    print(f"matmul achievable={achievable / 1e12:.3g} TFLOP/s datasheet={DATASHEET_PEAK_FLOPS / 1e12:.0f} TFLOP/s "
          f"(size {args.matmul_size})")
    measure(arch, train, device, args.micro_batch, args.warmup, compile_model=False)  # CUDA context, cuBLAS
    rates, compile_seconds = {}, {}
    for compile_model in (False, True):
        rates[compile_model], compile_seconds[compile_model] = measure(arch, train, device, args.micro_batch,
                                                                       args.steps, compile_model)
        flops = rates[compile_model] * per_token
        print(f"compile={compile_model} tokens/s={rates[compile_model]:,.0f} MFU={100 * flops / achievable:.1f}% "
              f"of achievable, {100 * flops / DATASHEET_PEAK_FLOPS:.1f}% of datasheet")
    print(f"compile speed-up={rates[True] / rates[False]:.2f}x compile seconds={compile_seconds[True]:.1f}")


if __name__ == "__main__":
    main()
