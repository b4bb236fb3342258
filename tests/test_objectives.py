"""Every objective in `search.base.objectives.OBJECTIVES` is ranked by its own metric everywhere: the
study store's ranking (terminal view, `search.export`), the export itself, the candidates
`search.confirm` picks, and the study report's score. One objective more (`tokens_per_s`, added
here) must need no other edit. Synthetic studies (tests/dashboard_study.py): no training."""

from __future__ import annotations

import optuna
import pytest
import yaml

from dashboards.analysis import top_k
from dashboards.data import load_study
from search.analysis.ranking import ranked_trials
from search.base.objectives import OBJECTIVES, Objective
from search.confirm import pick_candidates, study_objective
from search.export import export
from search.tracking.stores import study_storage
from search.tracking.tracker import StudyTracker
from tests.dashboard_study import scratch_store, write_study

THROUGHPUT = Objective("throughput", ("tokens_per_s",), ("maximize",), "tokens per second")


@pytest.fixture(scope="module")
def store():
    with scratch_store("cramnas-objectives-") as uri:
        yield uri


@pytest.mark.parametrize("name", [*OBJECTIVES, THROUGHPUT.name])
def test_each_objective_ranks_by_its_own_metric_everywhere(name, store, tmp_path, monkeypatch):
    monkeypatch.setitem(OBJECTIVES, THROUGHPUT.name, THROUGHPUT)  # the same table every reader holds
    objective = OBJECTIVES[name]
    study = write_study(store, f"objective-{name}", 9, controller="random", objective=name, pruned=(2,),
                        failed=(5,), repeats=(7,), seed=3)
    complete = study.by_state("complete")
    def order(by: Objective) -> list[int]:
        return [t.number for t in sorted(complete, key=lambda t: by.sort_key(t.metrics[by.rank_metric]))]

    expected = order(objective)
    # The loss and the throughput disagree on these trials: a reader ranking by the wrong one fails.
    assert order(OBJECTIVES["mlm"]) != order(THROUGHPUT)

    optuna_study = optuna.load_study(study_name=study.name, storage=study_storage(store))
    assert [t.number for t in ranked_trials(optuna_study, objective)] == expected

    out = tmp_path / "best.yaml"
    export(study.name, None, out, store, force=True)
    provenance = yaml.safe_load(out.read_text())["provenance"]
    assert (provenance["trial"], provenance["rank_by"]) == (expected[0], objective.rank_metric)

    tracker = StudyTracker(store, study.name)
    assert study_objective(tracker.study_run()) == objective
    assert [c.trial for c in pick_candidates(tracker, objective, 3)] == expected[:3]

    data = load_study(study.name, store)
    assert data.score.objective == objective and not data.score.note
    assert list(top_k(data.trials, data.score, 3)["trial"]) == expected[:3]
