"""The device a model runs on, its name in results, and the precision it computes in.

Shared by pretraining (`trainer.cram`) and fine-tuning (`glue`), so that both pick the same device
and compute in the same precision without the GLUE probe importing the training loop.
"""

from __future__ import annotations

import platform

import torch


def pick_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def device_name(device: torch.device) -> str:
    """What results record as their device: the GPU model, or the CPU and its thread count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def autocast(device: torch.device):
    """bf16 autocast on GPUs, full fp32 elsewhere: on a CPU without bf16 instructions (the 2-core
    EPYC of benchmarks/RESULTS.md) a 512x512 bf16 matmul takes about 15x as long as in fp32."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def to_device(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`batch` on `device` without blocking the host: a pinned copy is sent asynchronously to a
    GPU, so the next micro-batch is read while this one computes. On CPU, the batch itself."""
    if device.type != "cuda":
        return batch
    return batch.pin_memory().to(device, non_blocking=True)
