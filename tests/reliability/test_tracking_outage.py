"""MLflow going away mid-study: the driver holds its records in order and carries on, writes them
once the store is back (none lost, none twice), and `--resume` writes from the study store any run
MLflow never got."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from search.study import controllers
from search.study.driver import reconcile
from search.tracking.retry import PendingWrites, Retry, TrackingError, TrackingUnavailable
from search.tracking.tracker import StudyTracker
from space import load_space
from tests.helpers import FakeTime, cli_env, requires_shared_data
from tests.studies import PROFILE, check_stores_agree, kill_session, study_args, trials_in, wait_for
from trainer.config import TrainConfig


class Store:
    """A store that refuses connections while down, and records what reached it."""

    def __init__(self) -> None:
        self.up, self.written, self.attempts = True, [], 0

    def write(self, item) -> None:
        self.attempts += 1
        if not self.up:
            raise ConnectionError("connection refused")
        self.written.append(item)


def held_writes(store: Store, fake: FakeTime, said: list[str]):
    retry = Retry(timeout_s=10, sleep=fake.sleep, clock=fake.clock)
    writes = PendingWrites(lambda: store.up, every_s=5, sleep=fake.sleep, clock=fake.clock, say=said.append)

    def submit(item) -> None:
        writes.submit(f"write {item}", lambda: retry("writing", store.write, item))
    return writes, submit


def test_writes_are_held_in_order_while_the_store_is_down_and_replayed_once():
    store, fake, said = Store(), FakeTime(), []
    writes, submit = held_writes(store, fake, said)
    submit(1)
    assert store.written == [1] and not writes.queue
    store.up = False
    submit(2)  # retried for 10 s, then held
    assert fake.now == 10 and len(writes.queue) == 1
    assert len(said) == 1 and said[0].startswith("MLflow unreachable: holding its records and carrying on")
    attempts = store.attempts
    submit(3)
    submit(4)  # queued behind 2, untried: the store was checked less than 5 s ago
    assert store.attempts == attempts and len(writes.queue) == 3
    fake.now += 6
    submit(5)  # checked again: still down, so nothing is tried and nothing waits
    assert store.attempts == attempts and fake.now == 16 and len(writes.queue) == 4
    store.up = True
    submit(6)  # within 5 s of the last check: held
    assert store.written == [1]
    fake.now += 5
    submit(7)
    assert store.written == [1, 2, 3, 4, 5, 6, 7] and not writes.queue
    assert store.attempts == attempts + 6  # each held write went through exactly once
    assert said[-1].startswith("MLflow reachable again after")


def test_drain_waits_for_the_store_and_gives_up_in_one_line():
    store, fake, said = Store(), FakeTime(), []
    writes, submit = held_writes(store, fake, said)
    store.up = False
    submit(1)
    submit(2)
    with pytest.raises(TrackingUnavailable) as error:
        writes.drain(60)
    assert fake.now >= 70 and "\n" not in str(error.value)
    assert str(error.value).startswith("2 records (first: write 1) still not written after waiting 60 s")
    store.up = True
    writes.drain(60)
    assert store.written == [1, 2] and not writes.queue


def test_permanent_errors_are_raised_not_held():
    fake = FakeTime()
    writes = PendingWrites(lambda: True, sleep=fake.sleep, clock=fake.clock, say=lambda _: None)

    def bad_param() -> None:
        raise TrackingError("logging: Changing param values is not allowed")

    with pytest.raises(TrackingError, match="Changing param values"):
        writes.submit("bad", bad_param)
    assert not writes.queue and writes.held_since is None


@pytest.mark.slow
def test_resume_writes_the_runs_mlflow_never_got(tmp_path):
    """Trial 0's run was opened but never closed, trials 1 and 2 never reached MLflow (it was down
    until the driver gave up), trial 3 was running when the driver died."""
    space = load_space(PROFILE.parent / "tiny_space.yaml")
    study = controllers.open_study("gone", f"sqlite:///{tmp_path}/optuna.db", "random", "mlm", space, 0)
    train = TrainConfig().to_dict()
    tracker = StudyTracker(f"sqlite:///{tmp_path}/mlflow.db", "gone")
    tracker.start_study({"controller": "random", "train": train})
    numbers = [controllers.ask(study, space).number for _ in range(4)]
    assert numbers == [0, 1, 2, 3]
    tracker.open_trial_run(0, study.trials[0].user_attrs["arch"], train, study.trials[0].user_attrs["fingerprint"])
    controllers.tell(study, 0, values=[3.0], metrics={"validation_loss": 3.0, "tokens": 640.0})
    controllers.tell(study, 1, state="failed", reason="RuntimeError: boom")
    controllers.tell(study, 2, values=[2.5], metrics={"validation_loss": 2.5, "tokens": 640.0})

    assert reconcile(study, tracker, train) == {"stale_trials": 1, "rebuilt_runs": 2, "closed_runs": 4}
    runs = {int(r["trial"]): r for r in tracker.trial_table().to_dict("records")}
    assert {n: r["status"] for n, r in runs.items()} == {0: "FINISHED", 1: "FAILED", 2: "FINISHED", 3: "KILLED"}
    assert [runs[n]["metrics.validation_loss"] for n in (0, 2)] == [3.0, 2.5]
    assert runs[1]["tags.cramnas.failure_reason"] == "RuntimeError: boom"
    assert runs[3]["tags.cramnas.failure_reason"] == "driver died"
    assert runs[2]["params.arch.layers"] == str(study.trials[2].user_attrs["arch"]["layers"])
    assert reconcile(study, tracker, train) == {"stale_trials": 0, "rebuilt_runs": 0, "closed_runs": 0}
    assert len(tracker.trial_table()) == 4
    assert {n: r["tags.cramnas.state"] for n, r in runs.items()} == {0: "complete", 1: "failed", 2: "complete",
                                                                     3: "failed"}
    assert runs[1]["tags.cramnas.fingerprint"] == study.trials[1].user_attrs["fingerprint"]  # carried, not rebuilt


@requires_shared_data
@pytest.mark.slow
@pytest.mark.subprocess
def test_study_carries_on_through_a_tracking_server_restart(wiki_slice_dir, slice_cache, tmp_path, tracking_server):
    trials = 10
    args = study_args(tmp_path, wiki_slice_dir, "outage", "--trials", str(trials), "--controller", "random",
                      "--objective", "mlm", "--no-probe", "--no-early-stop", "--budget", "2s",
                      tracking_uri=tracking_server.uri, cache_dir=slice_cache)
    complete_trials = lambda: len(trials_in(tmp_path, "outage", TrialState.COMPLETE))
    log = tmp_path / "driver.log"
    with open(log, "w") as out:
        driver = subprocess.Popen([sys.executable, "-m", "search.run", *args], cwd=tmp_path, env=cli_env(),
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: complete_trials() >= 2, 240, "two complete trials")
        tracking_server.stop()
        down_at = complete_trials()
        assert down_at < trials, "the study ended before the server went down"
        wait_for(lambda: complete_trials() > down_at, 120, "a trial to complete with MLflow down")
        tracking_server.start()
        assert driver.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        if driver.poll() is None:
            kill_session(driver)
    output = log.read_text()
    assert "MLflow unreachable: holding its records and carrying on" in output, output[-3000:]

    study, runs = check_stores_agree(tmp_path, "outage", trials, tracking_uri=tracking_server.uri)
    assert all(t.state == TrialState.COMPLETE for t in study.trials)
    client = MlflowClient(tracking_server.uri)
    for run in runs:  # every progress point exactly once, and the final metrics
        trial = study.trials[int(run["trial"])]
        steps = [m.step for m in client.get_metric_history(run["run_id"], "train_loss")]
        assert len(steps) == len(set(steps)) == len(trial.user_attrs["intermediate"]), trial.number
        assert run["metrics.validation_loss"] == trial.user_attrs["metrics"]["validation_loss"]
    experiment = client.get_run(runs[0]["run_id"]).info.experiment_id
    study_runs = client.search_runs([experiment], "tags.`cramnas.kind` = 'study'")
    assert [r.info.status for r in study_runs] == ["FINISHED"]
