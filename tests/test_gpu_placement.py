"""Trials on GPUs (issue 13): a trial runs on CUDA only when Ray gave it a GPU, and as many trials
run at once as both the CPUs and the GPUs allow.

Ray is started with fake GPU resources on this CPU machine: Ray then assigns GPU ids to trials
exactly as on a GPU host, and `search.study.trial.trial_device` is checked with CUDA reported present.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from unittest import mock

import pytest

from search.study.ray_executor import start_local_ray
from search.study.resources import concurrency


@pytest.mark.parametrize(("resources", "have", "expected"), [
    ({"cpu": 8, "gpu": 1}, {"cpu": 32, "gpu": 1}, 1),      # one H200, 32 vCPUs: one trial, not 4
    ({"cpu": 6, "gpu": 1}, {"cpu": 48, "gpu": 8}, 8),      # eight GPUs: all eight busy
    ({"cpu": 2, "gpu": 0.5}, {"cpu": 16, "gpu": 1}, 2),    # two small trials packed on one GPU
    ({"cpu": 1, "gpu": 0.25}, {"cpu": 16, "gpu": 2}, 8),
    ({"cpu": 2, "gpu": 0}, {"cpu": 2, "gpu": 4}, 1),       # CPU trials: GPUs do not count
    ({"cpu": 2, "gpu": 0}, {"cpu": 7, "gpu": 0}, 3),
])
def test_concurrency_is_what_both_cpus_and_gpus_allow(resources, have, expected):
    warnings = []
    assert concurrency(resources, have, None, warnings.append) == expected
    assert warnings == []


def test_max_concurrent_above_what_fits_warns_once_and_is_lowered():
    warnings = []
    assert concurrency({"cpu": 4, "gpu": 1}, {"cpu": 32, "gpu": 2}, 5, warnings.append) == 2
    assert len(warnings) == 1 and "--max-concurrent 5" in warnings[0] and "running 2 at once" in warnings[0]
    assert concurrency({"cpu": 4, "gpu": 1}, {"cpu": 32, "gpu": 2}, 1, warnings.append) == 1
    assert len(warnings) == 1


def _placement(config):
    """A Tune trial that reports where search.study.trial would put it (CUDA reported present)."""
    import ray
    from ray import tune

    from search.study.trial import trial_device

    start = time.time()
    gpu_ids = [str(gpu) for gpu in ray.get_gpu_ids()]
    with mock.patch("torch.cuda.is_available", return_value=True):
        device = trial_device(gpu_ids).type
    time.sleep(config["hold_s"])  # keep the slot: trials that may overlap must, to be seen overlapping
    seen = {"start": start, "end": time.time(), "gpu_ids": ",".join(gpu_ids), "device": device, "niceness": os.nice(0)}
    (Path(config["out"]) / f"{uuid.uuid4().hex}.json").write_text(json.dumps(seen))
    tune.report({"done": 1})


def _run_placement(gpus_per_trial: float, trials: int, storage: str) -> list[dict]:
    import ray
    from ray import tune

    resources = {"cpu": 0.5, "gpu": gpus_per_trial}
    # Ray workers cannot import a test module: ship `_placement` by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # A new local Ray with fake GPUs, started as a study starts its own.
    start_local_ray(num_cpus=2, num_gpus=4, session="cramnas-ray-placement")
    try:
        placeable = ray.cluster_resources()
        concurrent = concurrency(resources, {"cpu": placeable["CPU"], "gpu": placeable["GPU"]}, None, print)
        tuner = tune.Tuner(
            tune.with_resources(_placement, resources),
            param_space={"hold_s": 10.0, "out": storage},
            tune_config=tune.TuneConfig(num_samples=trials, max_concurrent_trials=concurrent),
            run_config=tune.RunConfig(verbose=0, storage_path=storage),
        )
        tuner.fit()
    finally:
        ray.shutdown()
    return [json.loads(path.read_text()) for path in Path(storage).glob("*.json")]


@pytest.mark.slow
def test_four_fake_gpus_run_four_trials_at_once_each_on_its_own_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AIR_NEW_OUTPUT", "0")
    monkeypatch.chdir(tmp_path)
    results = _run_placement(gpus_per_trial=1, trials=4, storage=str(tmp_path))
    assert len(results) == 4
    assert sorted(result["gpu_ids"] for result in results) == ["0", "1", "2", "3"]
    assert all(result["device"] == "cuda" for result in results)
    # Not Ray's default 15 above the driver: trials get whole cores (a driver run under `nice` passes its
    # own niceness on, which is the user's choice).
    assert all(result["niceness"] == os.nice(0) for result in results)
    assert max(result["start"] for result in results) < min(result["end"] for result in results), \
        "the four trials did not all run at the same time"


@pytest.mark.slow
def test_a_trial_given_no_gpu_never_selects_cuda_on_a_gpu_host(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_AIR_NEW_OUTPUT", "0")
    monkeypatch.chdir(tmp_path)
    results = _run_placement(gpus_per_trial=0, trials=2, storage=str(tmp_path))
    assert [result["gpu_ids"] for result in results] == ["", ""]
    assert all(result["device"] == "cpu" for result in results)
