"""What issue 20 §1 took out of the budget clock, before against after, side by side in one process.

    python benchmarks/clock_overhead.py [--config trainer/configs/crammed-bert-cpu.yaml] [--repeats 50]

1. Masking a micro-batch (`mask_fixed_count`, the config's micro-batch of rows): before, a tensor
   of the special ids was built from Python on every call (on a GPU a blocking host-to-device
   copy); after, it comes from a cache per vocabulary and device (`special_token_ids`).
2. A rollback snapshot of weights and AdamW state: before, `clone()` into fresh memory inside the
   clock; after, `copy_` into a buffer allocated once before it (`trainer.rollback`), and the loop
   stops its clock around it. Printed: the copy itself, and what the clock now counts of it (0).
Medians of `--repeats`; the ratios are what to read (this shared machine's absolute speeds vary).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from trainer.config import load_run_config
from trainer.loop import build_optimizer
from trainer.masking import mask_fixed_count
from trainer.model import CrammedBert
from trainer.rollback import allocate_copies, training_state

SPECIALS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}


def median_ms(work, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "trainer/configs/crammed-bert-cpu.yaml"))
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    run = load_run_config(args.config)
    arch, train = run.arch, run.train
    rows = torch.randint(5, arch.vocab_size, (train.micro_batch, arch.max_seq_len))
    generator = torch.Generator().manual_seed(0)

    def mask_before() -> None:  # the old per-call tensor of special ids, then the same masking
        torch.isin(rows, torch.tensor(sorted(SPECIALS.values())))
        mask_fixed_count(rows, train.mlm_rate, special_ids=SPECIALS, vocab_size=arch.vocab_size, generator=generator)

    def mask_after() -> None:
        mask_fixed_count(rows, train.mlm_rate, special_ids=SPECIALS, vocab_size=arch.vocab_size, generator=generator)

    model = CrammedBert(arch)
    optimizer = build_optimizer(model, train, torch.device("cpu"))
    for param in model.parameters():  # one step on zero gradients: AdamW's state exists, as the loop makes it
        param.grad = torch.zeros_like(param)
    optimizer.step()
    state = training_state(model, optimizer)
    copies = allocate_copies(state)

    def snapshot_before() -> None:
        [tensor.clone() for tensor in state]

    def snapshot_after() -> None:
        for copy, tensor in zip(copies, state):
            copy.copy_(tensor)

    print(f"device=cpu threads=1 config={run.name} micro_batch={train.micro_batch} "
          f"state={sum(t.nbytes for t in state) / 2**20:.1f} MiB")
    for name, before, after in (("masking", mask_before, mask_after), ("snapshot", snapshot_before, snapshot_after)):
        b, a = median_ms(before, args.repeats), median_ms(after, args.repeats)
        counted = a if name == "masking" else 0.0  # the loop stops its clock around the snapshot now
        print(f"{name:8s} before {b:.3f} ms  after {a:.3f} ms  ({b / a:.2f}x)  in the clock now {counted:.3f} ms")


if __name__ == "__main__":
    main()
