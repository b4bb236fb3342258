"""Crams kept as they finish: a run of many crams (the accounting's ladders and ablations, the
transfer measurement) resumes where it stopped, each cram a line of `<out>/crams.jsonl` keyed by
(name, multiple of the budget, seed), never by the architecture's fingerprint, which a change of
`ArchConfig.canonical` may respell. The crams run side by side in spawned worker processes.
"""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
from pathlib import Path

from space.arch import ArchConfig
from space.errors import UsageError
from trainer.budget import Budget
from trainer.config import TrainConfig

SEEDS = (0, 1, 2)
UNIT = {"seconds": "s", "tokens": "tokens", "flops": "flops", "refs": "refs"}  # Budget.kind -> the unit Budget.parse reads


def cram_job(job: dict) -> dict:
    """One cram in a worker process; returns what the analysis needs."""
    import torch

    from space.arch import ArchConfig
    from trainer.corpus import CorpusSource
    from trainer.cram import cram
    from trainer.data import prepare_data

    torch.set_num_threads(job["threads"])
    arch, train = ArchConfig.from_dict(job["arch"]), TrainConfig.from_dict(job["train"])
    data = prepare_data(CorpusSource.from_args(data_dir=job["data"]), vocab_size=arch.vocab_size,
                        seq_len=arch.max_seq_len, cache_dir=job["cache_dir"])
    reports: list[float] = []
    result = cram(arch, train, data, Budget.parse(job["budget"]), on_progress=lambda p: reports.append(p.train_loss))
    # Everything of the CramResult but its curves (benchmarks/accounting.py reads the references too).
    kept = {key: value for key, value in result.to_dict().items() if not key.endswith("curve")}
    return {**kept, **{key: job[key] for key in ("key", "name", "budget")}, "reports": reports}


def worker_died(kept: int, total: int, path) -> SystemExit:
    """What a pool of `cram_job`s ends with when a worker is killed (out of memory, a signal): the
    pool then fails every cram left with BrokenProcessPool, which is no fault of theirs, so they
    are neither kept nor recorded as failed; the same command crams them."""
    return SystemExit(f"error: a cram's worker process died; {kept} of {total} crams finished and are kept in {path}; "
                      "run the same command again to go on")


class Crams:
    """Crams by (name, multiple, seed), run `jobs` at a time and kept in a JSON-lines file."""

    def __init__(self, out: Path, data: str, cache_dir: str | None, budget: Budget, jobs: int):
        self.path, self.data, self.cache_dir, self.budget, self.jobs = out / "crams.jsonl", data, cache_dir, budget, jobs
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        self.done = {row["key"]: row for row in map(json.loads, lines)}

    def key(self, name: str, multiple: float, seed: int) -> str:
        return f"{name}|{multiple:g}x|{seed}"

    def check(self, wanted: list[tuple[str, dict, dict, float, int]]) -> None:
        """Crams are kept by key (name, multiple, seed): a kept one of another architecture than the
        call asks under that key (an --out shared by two runs, a study whose winner changed) would be
        read as this one's. A one-line error instead, before anything is crammed."""
        for name, arch, _train, multiple, seed in wanted:
            kept = self.done.get(self.key(name, multiple, seed), {}).get("arch_fingerprint")  # every cram_job row has it
            if kept is not None and kept != ArchConfig.from_dict(arch).fingerprint():
                raise UsageError(f"--out: {self.path} keeps {self.key(name, multiple, seed)} of another architecture "
                                 f"than this call's {name}; pass another --out")

    def run(self, wanted: list[tuple[str, dict, dict, float, int]]) -> None:
        """Cram every (name, arch, train, multiple, seed) not done yet; each is kept as it finishes."""
        self.check(wanted)
        threads = max(1, (os.cpu_count() or 1) // self.jobs)
        jobs = {self.key(name, multiple, seed): {  # keyed: a cram asked for twice runs once
            "key": self.key(name, multiple, seed), "name": name, "arch": arch, "train": {**train, "seed": seed},
            "budget": f"{self.budget.amount * multiple:g}{UNIT[self.budget.kind]}", "data": self.data,
            "cache_dir": self.cache_dir, "threads": threads}
            for name, arch, train, multiple, seed in wanted if self.key(name, multiple, seed) not in self.done}
        jobs = list(jobs.values())
        jobs.sort(key=lambda job: -Budget.parse(job["budget"]).amount)  # longest first: the pool ends evenly
        print(f"{len(jobs)} crams to run, {len({self.key(n, m, s) for n, _, _, m, s in wanted}) - len(jobs)} done before",
              flush=True)
        kept = 0
        with concurrent.futures.ProcessPoolExecutor(self.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            for finished in concurrent.futures.as_completed([pool.submit(cram_job, job) for job in jobs]):
                try:
                    row = finished.result()
                except concurrent.futures.process.BrokenProcessPool:
                    raise worker_died(kept, len(jobs), self.path) from None
                kept += 1
                self.done[row["key"]] = row
                with self.path.open("a") as file:
                    file.write(json.dumps(row) + "\n")
                print(f"  {row['key']}: {row['validation_loss']:.4f} ({row['regime']}), {row['tokens']:,} tokens, "
                      f"{row['seconds']:.0f} s", flush=True)

    def losses(self, name: str, multiple: float, seeds=SEEDS) -> list[float]:
        return [self.done[k]["validation_loss"] for s in seeds if (k := self.key(name, multiple, s)) in self.done]

    def seconds(self, name: str, multiple: float, seeds=SEEDS) -> list[float]:
        """Each run's training wall time (the loop's clock: no data preparation or validation)."""
        return [self.done[k]["seconds"] for s in seeds if (k := self.key(name, multiple, s)) in self.done]

    def flops(self, name: str, multiple: float, seeds=SEEDS) -> list[float]:
        """Each run's training FLOPs as the loop counts them (tokens x `ArchConfig.flops_per_token`):
        a FLOP budget's amount up to whole micro-batches, and what any other budget cost."""
        return [self.done[k]["tokens"] * self.done[k]["flops_per_token"] for s in seeds
                if (k := self.key(name, multiple, s)) in self.done]

    def any(self, name: str) -> dict:
        return next(row for row in self.done.values() if row["name"] == name)
