"""Compile seconds of the training step: the whole model against each block (trainer/loop.py).

    python benchmarks/compile_seconds.py                      # hidden 64, 2 and 16 layers, CPU
    python benchmarks/compile_seconds.py --layers 2 4 --hidden 128 --device cuda

For each depth, in one process and side by side: "before" compiles the whole `CrammedBert` with
`fullgraph=True` (the trainer up to issue 20); "after" compiles each `Block` in place
(`Trainer.compiled` now). Each is timed from a `torch._dynamo.reset()` through the first
forward/backward of a masked micro-batch, what the trainer's warm-up does before its clock starts,
after one throw-away compile has paid Inductor's start-up.
Inductor's on-disk caches are pointed at a fresh directory per measurement so that no variant
reads the code another one generated.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch

from space.arch import ArchConfig
from trainer.masking import mask_fixed_count
from trainer.model import CrammedBert

SPECIALS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}


def compile_seconds(arch: ArchConfig, per_block: bool, device: torch.device, rows: int) -> float:
    """Seconds from a dynamo reset to the end of the first compiled forward/backward."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = CrammedBert(arch).to(device)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="compile-seconds-")
    ids = torch.randint(5, arch.vocab_size, (rows, arch.max_seq_len), generator=torch.Generator().manual_seed(0))
    batch = mask_fixed_count(ids.to(device), 0.25, special_ids=SPECIALS, vocab_size=arch.vocab_size)
    start = time.perf_counter()
    if per_block:
        for block in model.blocks:
            block.compile(fullgraph=True)
        step = model
    else:
        step = torch.compile(model, fullgraph=True)
    _, loss = step(batch.input_ids, labels=batch.labels, predict_at=batch.positions)
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[2, 16])
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    # The FX graph and autotune caches would let the second variant reuse the first's kernels.
    os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] = "0"
    os.environ["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "0"
    print(f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, "
          f"load average {' '.join(f'{load:.2f}' for load in os.getloadavg())}")
    # Inductor's one-time start (imports, compile workers) is paid here, not by the first variant.
    torch.compile(lambda x: (x * 2).sin())(torch.ones(4, device=device))
    print("| layers | hidden | whole model (before) | per block (after) | ratio |")
    print("|---|---|---|---|---|")
    for layers in args.layers:
        arch = ArchConfig(layers=layers, hidden=args.hidden, heads=max(1, args.hidden // 32), ffn_mult=4.0,
                          vocab_size=2048, max_seq_len=64)
        before = compile_seconds(arch, per_block=False, device=device, rows=args.rows)
        after = compile_seconds(arch, per_block=True, device=device, rows=args.rows)
        print(f"| {layers} | {args.hidden} | {before:.1f} s | {after:.1f} s | {before / after:.1f}x |", flush=True)
    print(f"load average after: {' '.join(f'{load:.2f}' for load in os.getloadavg())}")


if __name__ == "__main__":
    main()
