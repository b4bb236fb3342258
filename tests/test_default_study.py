"""benchmarks/default_study.py: the tables behind RESULTS' "The study a user runs", recomputed
from the stored crams alone, and the ASHA replay and compute multiple they rest on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import default_study  # noqa: E402


def row(trial: int, final: float, curve: list[float], first_draw: str = "") -> dict:
    arch = {"layers": 1, "hidden": 32 * (trial + 1), "position": "rotary", "norm_placement": "pre", "ffn_kind": "gelu"}
    return {"study": "s", "trial": str(trial), "state": "complete", "first_draw": first_draw, "validation_loss": str(final),
            "tokens": "1000", "flops_per_token": "1000", "curve": " ".join(map(str, curve)), "arch": json.dumps(arch),
            "nats_below_floor": "1.0", "architecture": f"1x{32 * (trial + 1)}"}


def test_asha_replayed_stops_what_is_worse_than_the_rung_quantile_so_far():
    # 4 reports; grace 1, reduction 2: rungs at reports 1 and 2. Trial 1 is worse than trial 0 at
    # report 1 (stopped there, a fifth of its budget); trial 2 is best at both and runs to the end.
    rows = [row(0, 5.0, [7.0, 6.5, 6.0, 5.5]), row(1, 6.0, [7.5, 7.0, 6.8, 6.5]), row(2, 4.0, [6.0, 5.0, 4.8, 4.5])]
    replay = default_study.asha_replay(rows, 1, 2)
    assert replay["kept"] == 2 and replay["keeps_best"] and replay["best_kept"]["trial"] == "2"
    assert replay["flops_share"] == pytest.approx((1 + 1 / 5 + 1) / 3)
    # The best trial arrives first and the others trail it at the rung: ASHA keeps only it.
    best_first = [{**rows[2], "trial": "0"}, {**rows[0], "trial": "1"}, {**rows[1], "trial": "2"}]
    assert default_study.asha_replay(best_first, 1, 2)["kept"] == 1


def test_compute_multiple_interpolates_in_log_compute():
    ladder = {1.0: 5.0, 2.0: 4.5, 4.0: 4.2}
    assert default_study.equivalent_multiple(5.1, ladder) == "1x or less"
    assert default_study.equivalent_multiple(4.75, ladder) == f"{2 ** 0.5:.1f}x"
    assert default_study.equivalent_multiple(4.0, ladder) == "more than 4x"


@pytest.mark.slow  # imports search.run (torch) and bootstraps every report
def test_the_results_tables_come_from_the_stored_crams_alone(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "default_study.py"), "report"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    for heading in ("### Each study", "### Winners confirmed", "### Rungs", "### ASHA replayed with other rungs"):
        assert heading in out.stdout
    assert "| default-s0 |" in out.stdout
