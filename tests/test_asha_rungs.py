"""ASHA that wastes nothing (issue 20, section 2): a trial whose budget is spent is never stopped
before its validation and probe, because no progress report comes at the end of the budget and
ASHA's rungs and `max_t` are derived from `report_every`."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from ray.tune.schedulers import TrialScheduler

from search.study.ray_executor import early_stopping
from space.arch import ArchConfig
from tests.helpers import SLICE_SEQ, SLICE_VOCAB
from trainer.budget import Budget
from trainer.config import TrainConfig
from trainer.cram import cram
from trainer.loop import max_progress_reports

ARCH = ArchConfig(layers=1, hidden=32, heads=2, ffn_mult=2.0, vocab_size=SLICE_VOCAB, max_seq_len=SLICE_SEQ)
SEARCH_CADENCE = TrainConfig().report_every  # what a search trial reports at
PROFILE = {"grace_reports": 4, "reduction_factor": 2}  # search/profiles/*.yaml


@pytest.mark.parametrize("report_every,reports", [(1 / 16, 15), (0.25, 3), (0.3, 3), (0.01, 99), (1.0, 0)])
def test_the_most_progress_reports_are_the_multiples_of_the_cadence_below_1(report_every, reports):
    assert max_progress_reports(report_every) == reports


def test_no_progress_report_comes_at_the_end_of_the_budget(wiki_slice):
    # One micro-batch per step and 64 steps: every sixteenth of the budget is a step boundary.
    reports = []
    result = cram(ARCH, TrainConfig(batch_size=4, micro_batch=4, seed=0), wiki_slice,
                  Budget.parse(f"{64 * 4 * SLICE_SEQ}tokens"), on_progress=reports.append)
    assert [r.fraction for r in reports] == [k / 16 for k in range(1, 16)]
    assert len(reports) == max_progress_reports(SEARCH_CADENCE)
    assert result.steps == 64 and reports[-1].step < result.steps  # training went on after the last one
    assert result.loss_curve[-1][0] == result.tokens  # the end still closes the loss curve


def test_asha_stops_trials_only_at_progress_reports_and_never_at_the_final_one():
    scheduler = early_stopping(PROFILE, SEARCH_CADENCE)
    scheduler.set_search_properties(None, None)
    progress = max_progress_reports(SEARCH_CADENCE)
    rungs = sorted(milestone for milestone, _ in scheduler._brackets[0]._rungs)
    assert rungs == [4, 8] and all(rung <= progress for rung in rungs)  # the rung at 16 was the budget's end
    assert progress < scheduler._max_t < progress + 1
    rng, stopped_at, finals = random.Random(0), [], []
    for number in range(32):
        trial = SimpleNamespace(trial_id=f"t{number}")
        scheduler.on_trial_add(None, trial)
        loss = rng.uniform(1.0, 8.0)
        for iteration in range(1, progress + 1):
            result = {"training_iteration": iteration, "train_loss": loss - 0.01 * iteration}
            if scheduler.on_trial_result(None, trial, result) == TrialScheduler.STOP:
                stopped_at.append(iteration)
                break
        else:  # the budget is spent: the final report, after validation and the probe
            final = {"training_iteration": progress + 1, "validation_loss": loss, "final": True}
            finals.append(scheduler.on_trial_result(None, trial, final))
    assert stopped_at and set(stopped_at) <= set(rungs)  # ASHA did stop trials, each with budget left
    assert finals and set(finals) == {TrialScheduler.CONTINUE}
