"""One store of crams kept as they finish, for every run of many crams: the size fit
(`search.sizing`), the accounting's ladders and ablations, the transfer measurement, the real-cram
table (benchmarks/cram_table.py) and the fidelity benchmark. A run stops at any point and the same
command resumes it, cramming only what its file does not have.

`CramStore` keeps one file, a line per cram: JSON lines (`crams.jsonl`), or CSV with a header when
given `columns` (benchmarks/cram_table.csv). Rows are found again by what identifies the cram, the
store's `identify` (e.g. name, multiple of the budget and seed), never by the architecture's
fingerprint alone: a change of `ArchConfig.canonical` respelled 27 fingerprints of the cram table,
and a resume keyed by them would have crammed those again. Instead a kept row under an identity must
be of the architecture this call asks for there (compared by today's fingerprint of what the row
trained where the row keeps it): an `--out` shared by two runs, or a study whose winner changed, is
refused in one line before anything is crammed.

Reading skips a line that is no whole row, with a note: a process killed while appending leaves the
last line cut short, and its cram runs again (the next row starts on a line of its own). `run`
crams what is missing one at a time in this process (sizing, which prepares its data once) or side
by side in spawned worker processes (`cram_job`), appending each row as its cram finishes. A cram
that diverged or ran out of memory is a row with its `error` and no loss, and the run goes on; any
other error (bad data, a bug) stops it with what finished kept. A killed worker ends the run with
`worker_died`'s one line.
"""

from __future__ import annotations

import concurrent.futures
import csv
import functools
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from search.analysis.ladder import UNIT
from space.arch import ArchConfig
from space.errors import UsageError
from trainer.budget import Budget
from trainer.config import TrainConfig

SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Cram:
    """One cram a store may run."""

    row: dict  # what its line keeps besides the result: what `identify` reads, and what readers need
    arch: ArchConfig  # what it trains: a kept row under its identity must be this architecture
    work: Any  # the runner's argument (picklable where workers run it)
    name: str  # what this call names the configuration crammed, e.g. winner
    label: str  # the cram in progress lines and messages, e.g. winner|1x|0


def kept_architecture(row: dict) -> str | None:
    """Today's fingerprint of what a kept row trained: of its `arch` where it keeps one, else the
    fingerprint it was written with (rows of `cram_job` before they kept `arch`), else None."""
    if isinstance(row.get("arch"), dict):
        return ArchConfig.from_dict(row["arch"]).fingerprint()
    return row.get("arch_fingerprint")


class CramStore:
    """The crams of one file by identity (`done`), and `run` for those missing."""

    def __init__(self, path: Path, identify: Callable[[dict], Hashable] = lambda row: row["key"],
                 columns: Sequence[str] = (), architecture: Callable[[dict], str | None] = kept_architecture):
        """`identify` maps a row (a kept one, or a `Cram.row`) to what identifies its cram;
        `columns`, a CSV file's header when the store starts it (a file's own header is kept);
        `architecture`, a kept row's architecture fingerprint (None: the row does not say)."""
        self.path, self.identify, self.architecture = Path(path), identify, architecture
        self.csv = bool(columns)
        self.columns = list(columns)
        self.done: dict[Hashable, dict] = {}
        text = self.path.read_text() if self.path.exists() else ""
        self.cut_short = bool(text) and not text.endswith("\n")  # the next row needs a line of its own
        lines = text.split("\n")
        if lines[-1] == "":  # after the last newline
            lines.pop()
        if self.csv and lines:
            self.columns = next(csv.reader([lines[0]]))
        for number, line in enumerate(lines[1:] if self.csv else lines, 2 if self.csv else 1):
            try:
                row = self._parse(line)
                self.done[self.identify(row)] = row
            except (ValueError, KeyError, TypeError, AttributeError, csv.Error):
                if line.strip():
                    print(f"note: {self.path}:{number} is not a whole cram row (cut short?); skipped, "
                          "its cram runs again", file=sys.stderr)

    def _parse(self, line: str) -> dict:
        if not self.csv:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise TypeError("not a row")
            return row
        values = next(csv.reader([line]))
        if len(values) != len(self.columns):  # a line cut short has fewer
            raise ValueError(f"{len(values)} values for {len(self.columns)} columns")
        return dict(zip(self.columns, values))

    def _append(self, row: dict) -> None:
        starts = not self.path.exists() or self.path.stat().st_size == 0
        with self.path.open("a", newline="" if self.csv else None) as file:
            if self.cut_short:
                file.write("\n")
                self.cut_short = False
            if not self.csv:
                file.write(json.dumps(row) + "\n")
                return
            writer = csv.DictWriter(file, self.columns, extrasaction="ignore")  # what the table has columns for
            if starts:
                writer.writeheader()
            writer.writerow(row)

    def pending(self, crams: Sequence[Cram]) -> list[Cram]:
        """The crams not kept yet, each once, in the order given."""
        missing = {}
        for cram in crams:
            missing.setdefault(self.identify(cram.row), cram)
        return [cram for key, cram in missing.items() if key not in self.done]

    def check(self, crams: Sequence[Cram]) -> None:
        """A one-line UsageError where a kept row under a cram's identity trained another
        architecture than the cram asks for (the store would read that row as this cram's)."""
        for cram in crams:
            kept = self.done.get(self.identify(cram.row))
            fingerprint = self.architecture(kept) if kept is not None else None
            if fingerprint is not None and fingerprint != cram.arch.fingerprint():
                raise UsageError(f"--out: {self.path} keeps {cram.label} of another architecture than this call's "
                                 f"{cram.name}; pass another --out")

    def run(self, crams: Sequence[Cram], runner: Callable[[Any], dict], workers: int | None = None) -> int:
        """Cram every one of `crams` not kept yet, in order: `runner(cram.work)` returns the result
        the row keeps beside `cram.row`. In this process one at a time (`workers` None), else in
        that many spawned worker processes (`runner` a module-level function). Each row is appended
        as its cram finishes; returns how many were crammed."""
        self.check(crams)
        pending = self.pending(crams)
        if not pending:
            return 0
        attempt = functools.partial(attempt_cram, runner)
        started, finished = time.perf_counter(), 0

        def keep(cram: Cram, result: dict | None, error: str | None) -> None:
            nonlocal finished
            # The cram's own fields last: a result never respells what identifies its row.
            row = {**result, **cram.row} if error is None else {**cram.row, "validation_loss": None, "error": error}
            self._append(row)
            self.done[self.identify(cram.row)] = row
            finished += 1
            print(f"  [{finished}/{len(pending)}, {(time.perf_counter() - started) / 60:.1f} min] {cram.label}: "
                  f"{outcome(row)}", flush=True)

        if workers is None:
            for number, cram in enumerate(pending, 1):
                print(f"  [{number}/{len(pending)}] {cram.label} ...", flush=True)
                keep(cram, *attempt(cram.work))
            return finished
        pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
        try:
            futures = {pool.submit(attempt, cram.work): cram for cram in pending}
            for future in concurrent.futures.as_completed(futures):
                keep(futures[future], *future.result())
        except concurrent.futures.process.BrokenProcessPool:
            raise worker_died(finished, len(pending), self.path) from None
        finally:
            pool.shutdown(cancel_futures=True)  # an error stops the run: the crams not started never are
        return finished


def attempt_cram(runner: Callable[[Any], dict], work: Any) -> tuple[dict | None, str | None]:
    """(result, None), or (None, the reason) where the cram itself failed: its loss diverged or its
    memory ran out, which the same cram would do again, so the row says why. Other errors (bad data,
    a bug) are raised: they are no property of this cram."""
    try:
        return runner(work), None
    except Exception as error:
        import torch  # the cram has imported it

        from trainer.rollback import NonFiniteLoss

        if isinstance(error, (NonFiniteLoss, torch.OutOfMemoryError)):
            return None, " ".join(f"{type(error).__name__}: {error}".split())
        raise


def outcome(row: dict) -> str:
    if row.get("error"):
        return f"failed ({row['error']})"
    regime = f" ({row['regime']})" if row.get("regime") else ""
    cost = f", {row['tokens']:,} tokens in {row['seconds']:.0f} s" if "tokens" in row and "seconds" in row else ""
    return f"validation loss {float(row['validation_loss']):.4f}{regime}{cost}"


def worker_died(kept: int, total: int, path) -> SystemExit:
    """What a run of crams in worker processes ends with when a worker is killed (out of memory, a
    signal): the pool then fails every cram left with BrokenProcessPool, which is no fault of
    theirs, so they are neither kept nor recorded as failed; the same command crams them."""
    return SystemExit(f"error: a cram's worker process died; {kept} of {total} crams finished and are kept in {path}; "
                      "run the same command again to go on")


# ---- crams in worker processes -------------------------------------------------------------------

def worker_job(key: str, arch: dict, train: dict, budget: str, data: str, cache_dir: str | None, jobs: int) -> dict:
    """`cram_job`'s argument: one of `jobs` crams side by side, each on its share of the cores."""
    return {"key": key, "arch": arch, "train": train, "budget": budget, "data": data, "cache_dir": cache_dir,
            "threads": max(1, (os.cpu_count() or 1) // jobs)}


def cram_job(job: dict) -> dict:
    """One cram in a worker process; everything of its CramResult but the curves, and the train
    losses it reported (benchmarks/fidelity.py reads ASHA's rung from them)."""
    import torch

    from trainer.corpus import CorpusSource
    from trainer.cram import cram
    from trainer.data import prepare_data

    torch.set_num_threads(job["threads"])
    arch, train = ArchConfig.from_dict(job["arch"]), TrainConfig.from_dict(job["train"])
    data = prepare_data(CorpusSource.from_args(data_dir=job["data"]), vocab_size=arch.vocab_size,
                        seq_len=arch.max_seq_len, cache_dir=job["cache_dir"])
    reports: list[float] = []
    result = cram(arch, train, data, Budget.parse(job["budget"]), on_progress=lambda p: reports.append(p.train_loss))
    kept = {key: value for key, value in result.to_dict().items() if not key.endswith("curve")}
    return {**kept, "reports": reports}


# ---- the accounting's and the transfer's crams ----------------------------------------------------

class Crams:
    """Crams by (name, multiple of `budget`, seed) in `<out>/crams.jsonl`, run `jobs` at a time."""

    def __init__(self, out: Path, data: str, cache_dir: str | None, budget: Budget, jobs: int):
        self.store = CramStore(out / "crams.jsonl")
        self.path, self.data, self.cache_dir, self.budget, self.jobs = self.store.path, data, cache_dir, budget, jobs
        self.done = self._with_loss()

    def _with_loss(self) -> dict[str, dict]:
        """The kept crams that gave a loss, by key (`done`, read once per run, not on every
        lookup); a failed one stays in the file (it is not crammed again) but has nothing to read."""
        return {key: row for key, row in self.store.done.items() if row.get("validation_loss") is not None}

    def key(self, name: str, multiple: float, seed: int) -> str:
        return f"{name}|{multiple:g}x|{seed}"

    def crams(self, wanted: list[tuple[str, dict, dict, float, int]]) -> list[Cram]:
        """(name, arch, train, multiple, seed) as the store's crams, longest first: the pool ends evenly."""
        crams = []
        for name, arch, train, multiple, seed in wanted:
            key, budget = self.key(name, multiple, seed), f"{self.budget.amount * multiple:g}{UNIT[self.budget.kind]}"
            crams.append(Cram({"key": key, "name": name, "budget": budget, "arch": arch}, ArchConfig.from_dict(arch),
                              worker_job(key, arch, {**train, "seed": seed}, budget, self.data, self.cache_dir,
                                         self.jobs), name, key))
        return sorted(crams, key=lambda cram: -Budget.parse(cram.row["budget"]).amount)

    def check(self, wanted: list[tuple[str, dict, dict, float, int]]) -> None:
        """Refuses, before anything is crammed, a kept cram of another architecture under a key."""
        self.store.check(self.crams(wanted))

    def run(self, wanted: list[tuple[str, dict, dict, float, int]]) -> None:
        """Cram every (name, arch, train, multiple, seed) not done yet; each is kept as it finishes."""
        crams = self.crams(wanted)
        pending = len(self.store.pending(crams))
        print(f"{pending} crams to run, {len({cram.label for cram in crams}) - pending} done before", flush=True)
        try:
            self.store.run(crams, cram_job, self.jobs)
        finally:
            self.done = self._with_loss()

    def _rows(self, name: str, multiple: float, seeds) -> list[dict]:
        return [self.done[k] for s in seeds if (k := self.key(name, multiple, s)) in self.done]

    def losses(self, name: str, multiple: float, seeds=SEEDS) -> list[float]:
        return [row["validation_loss"] for row in self._rows(name, multiple, seeds)]

    def seconds(self, name: str, multiple: float, seeds=SEEDS) -> list[float]:
        """Each run's training wall time (the loop's clock: no data preparation or validation)."""
        return [row["seconds"] for row in self._rows(name, multiple, seeds)]

    def flops(self, name: str, multiple: float, seeds=SEEDS) -> list[float]:
        """Each run's training FLOPs as the loop counts them (tokens x `ArchConfig.flops_per_token`):
        a FLOP budget's amount up to whole micro-batches, and what any other budget cost."""
        return [row["tokens"] * row["flops_per_token"] for row in self._rows(name, multiple, seeds)]

    def any(self, name: str) -> dict:
        return next(row for row in self.done.values() if row["name"] == name)
