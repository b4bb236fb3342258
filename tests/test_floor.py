"""Every search result says how far below the unigram floor (trainer/unigram.py) it ended: a trial's
metrics, the live view and the final table of `search.run`. The study is the synthetic one of
`tests/dashboard_study.py` (no training); the report's side is in tests/test_dashboards.py."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest
from rich.console import Console

from search.controllers import Proposal
from search.objectives import OBJECTIVES
from search.searcher import TrialOutcome
from search.stores import study_storage
from search.tracking import StudyTracker
from search.trial import trial_metrics
from search.view import StudyView
from space.arch import ArchConfig
from tests.dashboard_study import UNIGRAM_FLOOR, scratch_store, write_study
from trainer.console import floor_gap


def test_trial_metrics_carry_the_floor_and_the_nats_below_it():
    cram = {key: 1.0 for key in ("tokens", "tokens_per_s", "params", "flops_per_token", "seconds",
                                 "validation_seconds", "steps", "oom_halvings")}
    metrics = trial_metrics({**cram, "validation_loss": 6.2, "unigram_floor": 6.95, "nats_below_unigram": 0.75}, None)
    assert (metrics["validation_loss"], metrics["unigram_floor"], metrics["nats_below_unigram"]) == (6.2, 6.95, 0.75)


@pytest.fixture(scope="module")
def study():
    with scratch_store("cramnas-floor-") as uri:
        yield write_study(uri, "floor", 4, controller="tpe", objective="mlm")


def test_the_live_view_and_the_final_table_show_the_floor(study, capsys):
    objective = OBJECTIVES["mlm"]
    plan = SimpleNamespace(study=study.name, objective=objective, trials=4, storage=study_storage(study.uri),
                           tracking_uri=study.uri, unigram_floor=UNIGRAM_FLOOR)
    optuna_study = optuna.load_study(study_name=study.name, storage=plan.storage)
    view = StudyView(plan, optuna_study, StudyTracker(study.uri, study.name), already_done=0, remaining=4)
    best = min(study.trials, key=lambda t: t.metrics["validation_loss"])
    proposal = Proposal(best.number, ArchConfig.from_dict(best.arch), "fingerprint")
    view.record(TrialOutcome(best.number, "complete", best.metrics, proposal, best.run_id))

    console = Console(record=True, width=200)
    console.print(view.render())
    live = console.export_text()
    assert f"unigram floor {UNIGRAM_FLOOR:.3f} nats" in live
    assert f"{floor_gap(best.metrics['nats_below_unigram'])} the floor" in live

    view.final_table()
    printed = capsys.readouterr().out
    assert "nats vs floor" in printed and f"unigram floor {UNIGRAM_FLOOR:.3f} nats" in printed
    row = next(line for line in printed.splitlines() if best.run_id in line)
    assert f"{best.metrics['validation_loss']:.4f}" in row and floor_gap(best.metrics["nats_below_unigram"], unit="") in row
