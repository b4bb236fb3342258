"""Host overhead of a training micro-step: the time outside the model's forward/backward.

    python benchmarks/host_overhead.py [--config trainer/configs/crammed-bert-cpu.yaml] [--steps 30] [--device cpu]

Two micro-steps side by side, interleaved in one process, on the same rows of a config's shape:
- `before`: the trainer as it was (Bernoulli masking on the host, (B, T) labels and boolean
  indexing of the masked rows, a blocking copy of the labels, `float(loss)` after each micro-step);
- `after`: the trainer's `trainer.loop.mlm_backward` (rows sent without blocking, masked on the
  device at a fixed count per row, gathered positions, the loss left on the device).
Each is timed whole and as its forward/backward alone (inputs masked beforehand), synchronised
around the timing on CUDA; the overhead is the difference of the medians. On a CPU the
forward/backward is the same work for both, so the overhead is masking, indexing and copies; on
a GPU it also shows the waits for the host that the `after` step no longer has.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from trainer.config import load_run_config
from trainer.device import autocast
from trainer.loop import mlm_backward
from trainer.masking import mask_fixed_count, mask_tokens
from trainer.model import CrammedBert

SPECIALS = {"pad": 0, "unk": 1, "cls": 2, "sep": 3, "mask": 4}


class Data:
    """What `mlm_backward` reads of prepared data."""

    def __init__(self, vocab_size: int) -> None:
        self.special_ids, self.vocab_size = SPECIALS, vocab_size


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="trainer/configs/crammed-bert-cpu.yaml")
    parser.add_argument("--steps", type=int, default=30, help="timed micro-steps of each kind (after 3 warm-up)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    run = load_run_config(args.config)
    arch, train, device = run.arch, run.train, torch.device(args.device)
    torch.manual_seed(0)
    model = CrammedBert(arch).to(device).train()
    data = Data(arch.vocab_size)
    rows = torch.randint(5, arch.vocab_size, (train.micro_batch, arch.max_seq_len))
    host_generator = torch.Generator().manual_seed(0)
    device_generator = torch.Generator(device).manual_seed(0)

    def before() -> None:  # the micro-step of the trainer before issue 13
        ids, labels = mask_tokens(rows, train.mlm_rate, special_ids=SPECIALS, vocab_size=arch.vocab_size,
                                  generator=host_generator)
        with autocast(device):
            _, loss = model(ids.to(device, non_blocking=True), labels=labels.to(device))
        loss.backward()
        float(loss)

    def after() -> None:
        mlm_backward(model, rows, data, train.mlm_rate, device, device_generator)

    fixed_inputs = mask_fixed_count(rows.to(device), train.mlm_rate, special_ids=SPECIALS,
                                    vocab_size=arch.vocab_size, generator=device_generator)
    ids, labels = mask_tokens(rows, train.mlm_rate, special_ids=SPECIALS, vocab_size=arch.vocab_size)
    ids, labels = ids.to(device), labels.to(device)

    def before_model() -> None:
        with autocast(device):
            model(ids, labels=labels)[1].backward()

    def after_model() -> None:
        with autocast(device):
            model(fixed_inputs.input_ids, labels=fixed_inputs.labels, predict_at=fixed_inputs.positions)[1].backward()

    contenders = {"before": before, "before_model": before_model, "after": after, "after_model": after_model}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for i in range(args.steps + 3):
        for name, fn in contenders.items():
            synchronize(device)
            elapsed = timed(lambda: (fn(), synchronize(device)))
            model.zero_grad(set_to_none=True)
            if i >= 3:
                times[name].append(elapsed)
    median = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    print(f"device={device} threads={torch.get_num_threads()} config={run.name} micro_batch={train.micro_batch} "
          f"seq={arch.max_seq_len} vocab={arch.vocab_size} steps={args.steps} (median ms per micro-step)")
    for kind in ("before", "after"):
        overhead = median[kind] - median[f"{kind}_model"]
        print(f"{kind:>7}: micro-step {median[kind]:.2f} ms, forward/backward {median[f'{kind}_model']:.2f} ms, "
              f"outside it {overhead:.2f} ms ({overhead / median[kind]:.0%})")


if __name__ == "__main__":
    main()
