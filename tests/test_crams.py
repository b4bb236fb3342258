"""The one store of crams (search.analysis.crams.CramStore) that sizing, the accounting, the transfer,
the real-cram table and the fidelity benchmark resume their runs from: nothing kept is crammed
again, a line cut short is skipped, a respelled fingerprint finds its row, a failed cram is a row
with its reason, a killed worker ends the run in one line. Fake crams throughout: no training."""

from __future__ import annotations

import concurrent.futures
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from search import sizing
from search.analysis import cram_table
from search.analysis import crams as cram_store
from search.analysis.crams import Cram, CramStore
from space.arch import ArchConfig
from space.errors import UsageError
from tests.helpers import CONFIGS
from trainer.budget import Budget
from trainer.config import load_run_config
from trainer.rollback import NonFiniteLoss

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


class InlinePool(concurrent.futures.ThreadPoolExecutor):
    """The store's process pool, in this process and one at a time: the fake cram is called as is."""

    def __init__(self, workers: int, mp_context=None):
        super().__init__(1)


def arch(hidden: int = 32) -> ArchConfig:
    return ArchConfig(layers=1, hidden=hidden, heads=1)


def named(name: str, hidden: int = 32) -> Cram:
    return Cram({"key": name, "name": name, "arch": arch(hidden).to_dict()}, arch(hidden), name, name, name)


def loss_of(work: str) -> dict:
    return {"validation_loss": 4.0 + len(work) / 10, "regime": "neighbours", "tokens": 1000, "seconds": 1.0}


def never(work):
    raise AssertionError(f"crammed {work} again")


@pytest.mark.parametrize("workers", [None, 2])
def test_a_second_run_crams_only_what_the_file_lacks(tmp_path, monkeypatch, workers):
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", InlinePool)
    path = tmp_path / "crams.jsonl"
    crammed = []
    runner = lambda work: crammed.append(work) or loss_of(work)  # noqa: E731
    assert CramStore(path).run([named("a"), named("b"), named("a")], runner, workers) == 2  # asked twice: once
    assert crammed == ["a", "b"] and len(path.read_text().splitlines()) == 2
    store = CramStore(path)
    assert store.run([named("a"), named("b"), named("c")], runner, workers) == 1
    assert crammed == ["a", "b", "c"]
    assert CramStore(path).run([named("a"), named("b"), named("c")], never, workers) == 0
    row = CramStore(path).done["c"]
    assert row["validation_loss"] == pytest.approx(4.1) and row["arch"] == arch().to_dict()  # the cram's row, its result


def test_a_line_cut_short_is_skipped_with_a_note_and_its_cram_runs_again(tmp_path, capsys):
    path = tmp_path / "crams.jsonl"
    CramStore(path).run([named("a")], loss_of)
    with path.open("a") as file:
        file.write(json.dumps({**named("b").row, **loss_of("b")})[:40])  # killed while appending b
    store = CramStore(path)
    assert list(store.done) == ["a"]
    assert f"note: {path}:2 is not a whole cram row (cut short?); skipped" in capsys.readouterr().err
    store.run([named("a"), named("b")], loss_of)
    assert list(CramStore(path).done) == ["a", "b"]  # b on a line of its own, after the cut one


def test_a_cut_short_table_row_is_skipped_and_the_table_stays_csv(tmp_path):
    path = tmp_path / "table.csv"
    store = cram_table.table_store(path)
    crams = [table_cram(source, 0) for source in ("design:0", "design:1")]
    store.run(crams[:1], loss_of)
    text = path.read_text()
    path.write_text(text + text.splitlines()[1][:30])  # a second row, cut short
    store = cram_table.table_store(path)
    assert list(store.done) == [("design:0", "0", "2e12flops")]
    store.run(crams, loss_of)
    lines = path.read_text().splitlines()
    assert lines[0].split(",") == list(cram_table.COLUMNS) and len(lines) == 4  # header, a, the cut line, b
    assert list(cram_table.table_store(path).done) == [("design:0", "0", "2e12flops"), ("design:1", "0", "2e12flops")]


def table_cram(source: str, seed: int, config: ArchConfig | None = None) -> Cram:
    config = config or arch()
    row = {"key": f"{config.fingerprint()}|{seed}|2e12flops", "source": source, "seed": seed, "budget": "2e12flops",
           **config.to_dict()}
    return Cram(row, config, source, source, f"{source} seed {seed}")


def test_a_respelled_fingerprint_finds_its_row(tmp_path):
    """Rows are found by what identifies the cram, not by the fingerprint a change of
    `ArchConfig.canonical` may respell: sizing's key holds one, the table's key too."""
    run = load_run_config(CONFIGS / "sized-cpu.yaml")
    budget = Budget.parse("2e12flops")
    cram = sizing.sizing_cram(run.arch, run.train, budget, "/data")
    size, amount, fingerprint, train, source = cram.row["key"].split("|", 4)
    old = {**cram.row, "key": f"{size}|{amount}|0ldf1ngerpr1|{train}|{source}", **loss_of("x")}
    del old["train"]  # rows before kept their training settings only in the key
    (tmp_path / "crams.jsonl").write_text(json.dumps(old) + "\n")
    store = CramStore(tmp_path / "crams.jsonl", sizing.identify)
    assert store.run([cram], never) == 0
    other = sizing.sizing_cram(run.arch, run.train.__class__.from_dict({**run.train.to_dict(), "seed": 9}), budget, "/data")
    assert store.pending([other]) == [other]  # other training settings: another cram

    table = tmp_path / "table.csv"
    cram_table.table_store(table).run([table_cram("design:0", 0)], loss_of)
    text = table.read_text()
    table.write_text(text.replace(arch().fingerprint(), "0ldf1ngerpr1"))
    assert cram_table.table_store(table).run([table_cram("design:0", 0)], never) == 0


def test_a_kept_cram_of_another_architecture_is_refused_before_anything_is_crammed(tmp_path):
    table = tmp_path / "table.csv"
    cram_table.table_store(table).run([table_cram("design:0", 0)], loss_of)
    crams = [table_cram("design:0", 0, arch(64)), table_cram("design:1", 0)]
    with pytest.raises(UsageError, match=r"--out: .*table.csv keeps design:0 seed 0 of another architecture than "
                                         r"this call's design:0; pass another --out"):
        cram_table.table_store(table).run(crams, never)
    # JSON rows compare today's fingerprint of the architecture they keep, else the one they were written with.
    path = tmp_path / "crams.jsonl"
    path.write_text(json.dumps({"key": "a", "arch_fingerprint": "0ldf1ngerpr1"}) + "\n"
                    + json.dumps({"key": "b", "arch": arch().to_dict(), "arch_fingerprint": "0ldf1ngerpr1"}) + "\n")
    with pytest.raises(UsageError, match="keeps a of another architecture"):
        CramStore(path).check([named("a")])
    CramStore(path).check([named("b")])


@pytest.mark.parametrize("workers", [None, 1])
def test_a_failed_cram_is_a_row_with_its_reason_and_the_run_goes_on(tmp_path, monkeypatch, workers):
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", InlinePool)

    def diverging(work: str) -> dict:
        if work == "a":
            raise NonFiniteLoss(step=3, loss=float("nan"))
        return loss_of(work)

    path = tmp_path / "table.csv"
    crams = [table_cram("a", 0), table_cram("b", 0)]
    assert cram_table.table_store(path).run(crams, diverging, workers) == 2
    done = cram_table.table_store(path).done
    assert done[("a", "0", "2e12flops")]["error"] == ("NonFiniteLoss: training loss became nan at step 3; lower lr "
                                                      "or check the architecture")
    assert done[("a", "0", "2e12flops")]["validation_loss"] == "" and done[("b", "0", "2e12flops")]["error"] == ""
    assert cram_table.table_store(path).run(crams, never, workers) == 0  # it would fail again: kept


def test_an_error_that_is_no_crams_own_stops_the_run_and_keeps_what_finished(tmp_path):
    def broken(work: str) -> dict:
        if work == "b":
            raise ValueError("a bug")
        return loss_of(work)

    path = tmp_path / "crams.jsonl"
    with pytest.raises(ValueError, match="a bug"):
        CramStore(path).run([named("a"), named("b"), named("c")], broken)
    assert list(CramStore(path).done) == ["a"]  # neither b (no failed row for a bug) nor c (not started)


def test_the_accountings_crams_leave_a_failed_cram_out_of_their_losses(tmp_path, monkeypatch):
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", InlinePool)

    def cram_job(job: dict) -> dict:
        if job["key"].endswith("|1"):
            raise NonFiniteLoss(step=3, loss=float("inf"))
        return {**loss_of(job["key"]), "flops_per_token": 1e6}

    monkeypatch.setattr(cram_store, "cram_job", cram_job)
    crams = cram_store.Crams(tmp_path, "data", None, Budget.parse("2e12flops"), jobs=1)
    crams.run([("winner", arch().to_dict(), {}, 1, seed) for seed in (0, 1)])
    assert crams.losses("winner", 1) == [pytest.approx(5.1)] and list(crams.done) == ["winner|1x|0"]
    assert set(crams.store.done) == {"winner|1x|0", "winner|1x|1"}  # the failed one is kept: not crammed again


def test_a_dead_worker_ends_the_run_in_one_line_and_keeps_what_finished(tmp_path, monkeypatch):
    def dying(work: str) -> dict:
        if work != "a":  # the pool raises this for every cram once a worker is killed
            raise concurrent.futures.process.BrokenProcessPool("a process in the pool was terminated abruptly")
        return loss_of(work)

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", InlinePool)
    path = tmp_path / "crams.jsonl"
    with pytest.raises(SystemExit, match=r"^error: a cram's worker process died; 1 of 3 crams finished and are kept in "
                                         r".*crams.jsonl; run the same command again to go on$"):
        CramStore(path).run([named("a"), named("b"), named("c")], dying, workers=2)
    assert list(CramStore(path).done) == ["a"]  # no failed rows: b and c are crammed again


def test_the_committed_cram_table_is_read_whole_and_its_plan_resumes_without_recramming_it():
    store = cram_table.table_store(BENCHMARKS / "cram_table.csv")
    assert len(store.done) == 301 and store.columns == list(cram_table.COLUMNS)
    # The script's own plan, checked against the kept rows (each its planned architecture), crams none of them again.
    planned = subprocess.run([sys.executable, str(BENCHMARKS / "cram_table.py"), "--data", "d", "--dry-run"],
                             capture_output=True, text=True, check=True).stdout
    assert re.search(r"^\d+ crams at 2e12flops: \d+ to run, 301 in .*cram_table\.csv; ", planned), planned
