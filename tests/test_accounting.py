"""The arithmetic of benchmarks/accounting.py: compute-equivalent multiples, payback, size or design."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
accounting = importlib.import_module("accounting")


def test_compute_equivalent_interpolates_in_log_compute():
    multiples, losses = [1, 2, 4, 8, 16], [6.0, 5.0, 4.0, 3.5, 3.0]
    assert accounting.compute_equivalent(multiples, losses, 5.0) == pytest.approx(2.0)
    assert accounting.compute_equivalent(multiples, losses, 4.5) == pytest.approx(2 ** 1.5)  # halfway in log2
    assert accounting.compute_equivalent(multiples, losses, 6.5) == 1.0  # there already at 1x
    assert accounting.compute_equivalent(multiples, losses, 2.9) is None  # never within the ladder: "> 16x"


def test_payback_counts_final_runs():
    account = accounting.payback(search_flops=100.0, final_flops=10.0, factor=3.0)
    assert account == {"search_in_final_runs": 10.0, "saved_per_run": 20.0, "payback_runs": 5.0}
    assert accounting.payback(100.0, 10.0, None)["payback_runs"] is None  # no measurable saving
    assert accounting.payback(100.0, 10.0, 1.0)["payback_runs"] is None


def test_split_win_into_size_and_design():
    grid = {("winner", "winner"): 4.0, ("winner", "baseline"): 4.5, ("baseline", "winner"): 5.0,
            ("baseline", "baseline"): 6.0}
    parts = accounting.split_win(grid)
    assert parts["win"] == pytest.approx(2.0)
    assert parts["size"] + parts["design"] == pytest.approx(parts["win"])
    assert parts["size"] == pytest.approx(0.75) and parts["design"] == pytest.approx(1.25)
    # the baseline's size costs 1.0 under the baseline's design, 0.5 under the winner's
    assert parts["interaction"] == pytest.approx(0.5)


def test_the_proving_ground_reads_the_transfer_of_ranks_from_trial_to_confirmation():
    proving_ground = importlib.import_module("proving_ground")
    same_order = [(5.0, 4.0), (5.5, 4.6), (6.0, 5.1), (6.5, 5.3)]
    assert "Spearman 1.00" in proving_ground.transfer(same_order)
    reversed_order = [(trial, -confirmed) for trial, confirmed in same_order]
    assert "Spearman -1.00" in proving_ground.transfer(reversed_order)
    assert "too few to rank" in proving_ground.transfer(same_order[:2])
