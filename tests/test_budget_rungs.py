"""benchmarks/budget_rungs.py: whole crams at a share of the trial budget, planned from the default
studies' trials and kept by study, trial and budget; RESULTS shows the table the stored crams give."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "budget_rungs.py"


@pytest.fixture
def budget_rungs(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import budget_rungs

    return budget_rungs


def test_each_distinct_trained_architecture_is_crammed_once_at_the_share_with_the_studys_seed(budget_rungs):
    trials = budget_rungs.distinct_trials()
    assert len({trial["arch"] for trial in trials}) == len(trials)
    assert all(trial["state"] == "complete" and trial["validation_loss"] for trial in trials)
    crams = budget_rungs.planned(trials[:3], 0.25, {"seed": 0}, "data", None, 2)
    assert [cram.row["budget"] for cram in crams] == ["5e11flops"] * 3
    assert [cram.work["budget"] for cram in crams] == ["5e11flops"] * 3 and crams[0].work["threads"] >= 1
    assert [(cram.row["study"], cram.row["trial"]) for cram in crams] == [(t["study"], t["trial"]) for t in trials[:3]]
    assert crams[0].arch.to_dict() == json.loads(trials[0]["arch"])


def test_a_kept_row_is_found_again_and_another_architecture_under_its_key_is_refused(budget_rungs, tmp_path):
    from space.errors import UsageError

    trials = budget_rungs.distinct_trials()
    first, second = budget_rungs.planned(trials[:2], 0.25, {"seed": 0}, "data", None, 2)
    store = budget_rungs.store(tmp_path / "rungs.csv")
    store._append({**first.row, "validation_loss": 6.0})
    again = budget_rungs.store(tmp_path / "rungs.csv")
    assert again.pending([first, second]) == [second]
    # The same key holding another trial's architecture (a study exported anew, say) is refused.
    budget_rungs.store(tmp_path / "other.csv")._append({**first.row, "arch": second.row["arch"], "validation_loss": 6.0})
    with pytest.raises(UsageError, match="another architecture"):
        budget_rungs.store(tmp_path / "other.csv").check([first])


@pytest.mark.slow  # bootstraps every correlation
def test_results_show_the_table_of_the_stored_crams(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--report"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| 5e11flops |")]
    assert rows, out.stdout
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    missing = [line for line in out.stdout.splitlines() if line.startswith("|") and line not in results]
    assert not missing, f"RESULTS.md lacks {len(missing)} rows of the report, e.g. {missing[0]}"
