"""What a trial may use on this machine or node: its GPUs, and how many CPUs a trial gets when the
profile says `cpus_per_trial: auto`. Read by search.run (local checks), search.study (a cluster's
node) and search.estimate."""

from __future__ import annotations


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
