"""`search.run --executor local`: the study without Ray.

Its early stopping (`search.study.asha.SuccessiveHalving`) decides what Ray's ASHA decides on the same
reports; its studies give the records the Ray executor's give (the study tests of ASHA, of trial
faults, a killed worker process among them, and of a killed driver's resume, in tests/test_search.py
and tests/reliability/, run on both executors); and it needs no Ray."""

from __future__ import annotations

import random
import sys
from types import SimpleNamespace

import pytest

from search.run import main
from search.study.asha import SuccessiveHalving
from search.study.local_executor import slot_gpus
from trainer.loop import max_progress_reports


@pytest.mark.parametrize("grace,factor,reports", [(4, 2, 15), (2, 2, 15), (1, 3, 15), (2, 4, 99)])
def test_successive_halving_decides_as_rays_asha_on_the_same_reports(grace, factor, reports):
    """Trials interleaved at random, some with tied losses and a NaN among them: every decision of
    ours is Ray's (`search.study.ray_executor.early_stopping`'s scheduler)."""
    from ray.tune.schedulers import TrialScheduler

    from search.study.ray_executor import early_stopping

    report_every = 1 / (reports + 1)
    assert max_progress_reports(report_every) == reports
    ray_asha = early_stopping({"grace_reports": grace, "reduction_factor": factor}, report_every)
    ours = SuccessiveHalving(grace, factor, max_progress_reports(report_every) + 0.5)
    assert ours.milestones == sorted(milestone for milestone, _ in ray_asha._brackets[0]._rungs)
    rng = random.Random(grace * 100 + factor)
    trials = {f"t{n}": {"at": 0, "base": rng.choice([3.0, 4.0, rng.uniform(2, 8)]), "alive": True} for n in range(40)}
    for trial_id in trials:
        ray_asha.on_trial_add(None, SimpleNamespace(trial_id=trial_id))
    stops = 0
    while any(t["alive"] for t in trials.values()):
        trial_id = rng.choice([name for name, t in trials.items() if t["alive"]])
        trial = trials[trial_id]
        trial["at"] += 1
        loss = float("nan") if (trial_id == "t7" and trial["at"] == grace) else trial["base"] - 0.01 * trial["at"]
        theirs = ray_asha.on_trial_result(None, SimpleNamespace(trial_id=trial_id),
                                          {"training_iteration": trial["at"], "train_loss": loss})
        stop = ours.should_stop(trial_id, trial["at"], loss)
        assert stop == (theirs == TrialScheduler.STOP), (trial_id, trial["at"], loss)
        stops += stop
        trial["alive"] = not stop and trial["at"] < reports
    assert stops > 0  # the comparison covered stops, not only "go on"


def test_each_trial_at_once_gets_its_own_gpus_or_its_share_of_one():
    assert slot_gpus(0, 0) == () and slot_gpus(3, 0) == ()
    assert [slot_gpus(slot, 1) for slot in range(3)] == [("0",), ("1",), ("2",)]
    assert slot_gpus(1, 2) == ("2", "3")
    assert [slot_gpus(slot, 0.5) for slot in range(4)] == [("0",), ("0",), ("1",), ("1",)]


def test_the_local_executor_runs_without_ray(monkeypatch):
    """What a GPU machine without Ray's wheel imports: the driver's modules and the worker's."""
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    # search itself too: the fresh imports then set their attributes on a fresh package, and the old
    # `search.study` (whose `.trial` later tests patch) stays what sys.modules holds after the undo.
    for name in [n for n in sys.modules if n == "search" or n.startswith("search.")]:
        monkeypatch.delitem(sys.modules, name)
    import search.study.driver
    import search.study.local_executor
    import search.study.trial  # noqa: F401 - imported to see that it can be

    # Each import above would have raised ImportError had it (or a module it imports) needed Ray.
    assert callable(search.study.driver.run_study) and callable(search.study.local_executor.run_locally)


def test_local_executor_refuses_a_ray_address_in_one_line(tmp_path, capsys):
    assert main(["--executor", "local", "--address", "auto", "--trials", "1", "--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--address" in err and "--executor local" in err
