"""What a trial may use on this machine or node: its GPUs, how many CPUs a trial gets when the
profile says `cpus_per_trial: auto`, and how many trials run at once. Read by search.run (local
checks), the executors (a cluster's node; this machine) and search.study.estimate."""

from __future__ import annotations

from collections.abc import Callable


def local_gpus() -> int:
    import torch  # seconds to import: only when GPUs are asked for

    return torch.cuda.device_count()


# `cpus_per_trial: auto` gives a GPU trial its node's CPUs per GPU up to this many: enough for the
# host side of one trial (data, masking copies, Inductor's compile workers), and a node with fewer
# CPUs per GPU still runs a trial on every GPU.
AUTO_CPUS_CAP = 8


def auto_cpus_per_trial(cpus: float, gpus: float, gpus_per_trial: float, cap: int = AUTO_CPUS_CAP) -> int:
    """CPUs per trial when the profile says `auto`: the node's CPUs shared by the trials its GPUs
    hold at once (cpus // (gpus / gpus_per_trial)), at least 1 and at most `cap`; a node without GPUs
    (or a CPU trial) gets `cap`, or all its CPUs if fewer."""
    trials_at_once = gpus / gpus_per_trial if gpus > 0 and gpus_per_trial > 0 else 1
    return max(1, min(cap, int(cpus // max(trials_at_once, 1))))


def concurrency(resources: dict[str, float], have: dict[str, float], max_concurrent: int | None,
                warn: Callable[[str], None]) -> int:
    """How many trials run at once: min(cpus // cpus_per_trial, gpus // gpus_per_trial) over the
    kinds a trial asks for, `have` being what Ray can place trials on (this machine, or the
    cluster). A `--max-concurrent` above that gets one warning line and is lowered to it: Ray would
    only queue the extra trials, already told to Optuna and RUNNING in MLflow."""
    fits = max(1, min((int(have.get(kind, 0) // amount) for kind, amount in resources.items() if amount > 0),
                      default=1))
    if max_concurrent is None:
        return fits
    if max_concurrent > fits:
        asked = " and ".join(f"{amount:g} {kind.upper()}" for kind, amount in resources.items() if amount > 0)
        warn(f"warning: --max-concurrent {max_concurrent}: trials of {asked} each fit {fits} at once in "
             f"{have.get('cpu', 0):g} CPUs and {have.get('gpu', 0):g} GPUs; running {fits} at once")
        return fits
    return max_concurrent
