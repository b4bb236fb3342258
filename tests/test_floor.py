"""Every search result says how far below the unigram floor (trainer/unigram.py) it ended: a trial's
metrics, the live view and the final table of `search.run`. The study is the synthetic one of
`tests/dashboard_study.py` (no training); the report's side is in tests/test_dashboards.py."""

from __future__ import annotations

from types import SimpleNamespace

import optuna
import pytest
from rich.console import Console

from search.base.objectives import OBJECTIVES
from search.study.controllers import Proposal
from search.study.report import trial_metrics
from search.study.searcher import TrialOutcome
from search.study.view import StudyView
from search.tracking.stores import study_storage
from search.tracking.tracker import StudyTracker
from space.arch import ArchConfig
from tests.dashboard_study import UNIGRAM_FLOOR, scratch_store, write_study
from trainer.console import floor_gap


def test_trial_metrics_carry_the_references_and_the_loss_by_kind():
    cram = {key: 1.0 for key in ("tokens", "tokens_per_s", "params", "flops_per_token", "seconds",
                                 "validation_seconds", "steps", "oom_halvings")}
    metrics = trial_metrics({**cram, "validation_loss": 6.2, "unigram_floor": 6.95, "nats_below_unigram": 0.75,
                             "corruption_floor": 6.4, "nats_below_floor": 0.2, "context_reference": 3.2,
                             "validation_loss_by_kind": {"mask": 6.8, "random": 7.0, "unchanged": 0.5}}, None)
    assert (metrics["validation_loss"], metrics["unigram_floor"], metrics["nats_below_unigram"]) == (6.2, 6.95, 0.75)
    assert (metrics["corruption_floor"], metrics["nats_below_floor"], metrics["context_reference"]) == (6.4, 0.2, 3.2)
    assert (metrics["validation_loss.mask"], metrics["validation_loss.unchanged"]) == (6.8, 0.5)


@pytest.fixture(scope="module")
def study():
    with scratch_store("cramnas-floor-") as uri:
        yield write_study(uri, "floor", 4, controller="tpe", objective="mlm")


def test_the_live_view_and_the_final_table_show_the_floor(study, capsys):
    objective = OBJECTIVES["mlm"]
    plan = SimpleNamespace(study=study.name, objective=objective, trials=4, storage=study_storage(study.uri),
                           tracking_uri=study.uri, unigram_floor=UNIGRAM_FLOOR, corruption_floor=None,
                           context_reference=None)  # a study of data prepared before the references
    optuna_study = optuna.load_study(study_name=study.name, storage=plan.storage)
    view = StudyView(plan, optuna_study, StudyTracker(study.uri, study.name), already_done=0, remaining=4)
    best = min(study.trials, key=lambda t: t.metrics["validation_loss"])
    proposal = Proposal(best.number, ArchConfig.from_dict(best.arch), "fingerprint")
    view.record(TrialOutcome(best.number, "complete", best.metrics, proposal, best.run_id))

    console = Console(record=True, width=200)
    console.print(view.render())
    live = console.export_text()
    assert f"unigram floor {UNIGRAM_FLOOR:.3f} nats" in live
    assert f"{floor_gap(best.metrics['nats_below_unigram'])} the unigram floor" in live

    view.final_table()
    printed = capsys.readouterr().out
    assert "vs corruption floor" in printed and f"unigram floor {UNIGRAM_FLOOR:.3f} nats" in printed
    row = next(line for line in printed.splitlines() if best.run_id in line)
    assert f"{best.metrics['validation_loss']:.4f}" in row and floor_gap(best.metrics["nats_below_unigram"], unit="") in row
    assert ArchConfig.from_dict(best.arch).describe() in row  # a log's table keeps each architecture on one line


def test_a_trial_with_the_references_is_read_against_the_corruption_floor_and_its_regime(study):
    plan = SimpleNamespace(study=study.name, objective=OBJECTIVES["mlm"], trials=4, storage=study_storage(study.uri),
                           tracking_uri=study.uri, unigram_floor=6.387, corruption_floor=5.856, context_reference=3.192)
    view = StudyView(plan, optuna.load_study(study_name=study.name, storage=plan.storage),
                     StudyTracker(study.uri, study.name), already_done=0, remaining=4)
    best = study.trials[0]
    metrics = {**best.metrics, "validation_loss": 4.0, "nats_below_floor": 1.856, "corruption_floor": 5.856,
               "context_reference": 3.192}
    outcome = TrialOutcome(best.number, "complete", metrics, Proposal(best.number, ArchConfig.from_dict(best.arch), "f"),
                           best.run_id)
    view.record(outcome)
    line = view.trial_line(outcome)
    assert "4.0000, 1.856 nats below the corruption floor; regime neighbours" in line
    console = Console(record=True, width=200)
    console.print(view.render())
    live = console.export_text()
    assert "corruption floor 5.856 nats (learned nothing), two-neighbour count model 3.192 nats" in live
    assert "1.856 nats below the corruption floor, neighbours" in live
