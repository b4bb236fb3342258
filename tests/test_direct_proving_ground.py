"""benchmarks/direct_proving_ground.py: a study driven without Ray or MLflow records what search.run
records, starts from the profile's first draw, and resumes a study that a kill cut short."""

from __future__ import annotations

import sys
import time

import optuna
import pytest

from tests.helpers import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from accounting import study_compute, study_winner  # noqa: E402
from direct_proving_ground import drive, storage_of  # noqa: E402

from search import attrs  # noqa: E402
from search.controllers import DRIVER_DIED, ask  # noqa: E402
from space import default_space_path, load_space  # noqa: E402


def job(out, data, cache, trials):
    return {"spec": "tpe:0", "out": str(out), "trials": trials, "budget": "2e10flops", "data": str(data),
            "cache_dir": str(cache), "deadline": time.time() + 600, "threads": 1}


@pytest.mark.slow
def test_a_direct_study_starts_with_the_hand_designs_and_resumes_a_trial_cut_short(wiki_slice_dir, slice_cache, tmp_path):
    assert drive(job(tmp_path, wiki_slice_dir, slice_cache, 2)) == "pg-tpe-s0: 2 complete, 0 failed"
    storage = storage_of(str(tmp_path), "pg-tpe-s0")
    study = optuna.load_study(study_name="pg-tpe-s0", storage=storage)
    assert [t.user_attrs.get(attrs.WARM_START) for t in study.trials] == ["sized-cpu", "neobert-cpu"]
    assert study.user_attrs[attrs.BUDGET] == "2e10flops" and study.user_attrs[attrs.TRAIN]["lr"] > 0
    assert all(t.user_attrs[attrs.METRICS]["tokens"] > 0 for t in study.trials)

    cut = ask(study, load_space(default_space_path("cpu")))  # a trial the driver was training when it was killed
    assert drive(job(tmp_path, wiki_slice_dir, slice_cache, 3)) == "pg-tpe-s0: 3 complete, 0 failed"
    trials = optuna.load_study(study_name="pg-tpe-s0", storage=storage).trials
    assert trials[cut.number].user_attrs[attrs.FAILURE_REASON] == DRIVER_DIED
    assert trials[-1].params == trials[cut.number].params  # trained again, with the same architecture
    assert trials[-1].user_attrs[attrs.RERUN_OF] == cut.number

    arch, train, budget = study_winner(storage, "pg-tpe-s0")  # what the confirmations and accounting read
    assert budget == "2e10flops" and arch in [t.user_attrs[attrs.ARCH] for t in trials]
    assert study_compute(storage, "pg-tpe-s0")["trials"] == 3


def test_the_curve_of_sized_cpu_takes_fewer_seeds_where_the_confirmations_have_none(monkeypatch, tmp_path):
    import argparse

    import direct_proving_ground
    from accounting import Crams

    asked = []
    monkeypatch.setattr(Crams, "run", lambda self, wanted: asked.extend(wanted))
    args = argparse.Namespace(out=str(tmp_path), data="d", cache_dir=None, budget="2e10flops", jobs=1,
                              baselines=["sized-cpu", "neobert-cpu"], confirm_at=(1, 3), curve=(1, 2, 8), curve_seeds=1)
    direct_proving_ground.confirm(args, [])
    seeds = {}
    for name, _, _, multiple, seed in asked:
        seeds.setdefault((name, multiple), set()).add(seed)
    assert seeds == {("sized-cpu", 1): {0, 1, 2}, ("sized-cpu", 3): {0, 1, 2}, ("neobert-cpu", 1): {0, 1, 2},
                     ("neobert-cpu", 3): {0, 1, 2}, ("sized-cpu", 2): {0}, ("sized-cpu", 8): {0}}
