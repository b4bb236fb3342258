"""GPU check: crammed-bert training throughput and MFU, eager against torch.compile.

    bash benchmarks/gpu_check.sh              # on a GPU: crammed-bert (16 layers, 768 hidden), bf16
    bash benchmarks/gpu_check.sh --dry-run    # anywhere: a tiny model on CPU, same code path

Each variant runs warm-up steps, then times `--steps` optimizer steps (forward, backward, fused
AdamW, 25% of tokens masked and predicted sparsely) on random token ids: throughput does not depend
on the text. MFU = tokens/s x training FLOPs per token (ArchConfig.flops_per_token) / peak, with the
peak at 790 TFLOP/s, the H200's measured bf16 rate.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from trainer.config import load_run_config
from trainer.cram import autocast, build_optimizer, device_name, pick_device
from trainer.model import CrammedBert

PEAK_FLOPS = 790e12
CONFIG = Path(__file__).resolve().parents[1] / "trainer" / "configs" / "crammed-bert.yaml"


def measure(arch, train, device, micro_batch: int, steps: int, warmup: int, compile_model: bool) -> float:
    torch.manual_seed(0)
    model = CrammedBert(arch).to(device)
    step_model = torch.compile(model) if compile_model else model
    optimizer = build_optimizer(model, train, device)
    ids = torch.randint(5, arch.vocab_size, (micro_batch, arch.max_seq_len), device=device)
    labels = torch.where(torch.rand(ids.shape, device=device) < train.mlm_rate, ids, torch.full_like(ids, -100))

    def step() -> None:
        with autocast(device):
            _, loss = step_model(ids, labels=labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return steps * ids.numel() / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny model on CPU: checks the code path")
    parser.add_argument("--micro-batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()

    run = load_run_config(CONFIG)
    arch, train = run.arch, run.train
    device = pick_device()
    if args.dry_run:
        arch = arch.replace(layers=2, hidden=64, heads=4, vocab_size=512)
        device, args.micro_batch, args.steps, args.warmup = torch.device("cpu"), 4, 2, 1
    elif device.type != "cuda":
        raise SystemExit("gpu_check: no CUDA device; use --dry-run to check the code path on CPU")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    per_token = arch.flops_per_token(arch.max_seq_len, train.mlm_rate)
    print(f"device={device_name(device)} layers={arch.layers} hidden={arch.hidden} params={arch.num_params() / 1e6:.1f}M "
          f"seq={arch.max_seq_len} micro_batch={args.micro_batch} dtype={'bf16' if device.type == 'cuda' else 'fp32'} "
          f"flops/token={per_token:.3g}")
    rates = {}
    for compile_model in (False, True):
        rates[compile_model] = measure(arch, train, device, args.micro_batch, args.steps, args.warmup, compile_model)
        mfu = rates[compile_model] * per_token / PEAK_FLOPS
        print(f"compile={compile_model} tokens/s={rates[compile_model]:,.0f} MFU={100 * mfu:.1f}%")
    print(f"compile speed-up={rates[True] / rates[False]:.2f}x")


if __name__ == "__main__":
    main()
