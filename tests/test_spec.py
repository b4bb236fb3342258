"""`search.study.spec.TrialSpec`: what a trial needs, typed, through the plain dict Ray carries."""

from __future__ import annotations

import json

from search.study.spec import Probe, TrialSpec
from space.arch import ArchConfig
from trainer.budget import Budget
from trainer.config import TrainConfig


def test_a_trial_spec_survives_the_ray_edge():
    template = TrialSpec(TrainConfig(lr=2e-3), Budget.parse("2e4tokens"), "abc123", data_dir="/data",
                         cache_dir="/cache", probe=Probe(("rte", "stsb"), {"max_seconds_per_task": 2.0, "data_dir": "/data"}),
                         checkpoint_dir="/ckpt/s1")
    assert template.arch is None and template.checkpoint_path() is None  # no trial yet
    arch = ArchConfig(layers=2, hidden=64, heads=2)
    spec = template.for_trial(7, arch)
    plain = json.loads(json.dumps(spec.to_dict()))  # what Ray hands the worker: plain values only
    assert TrialSpec.from_dict(plain) == spec
    assert spec.checkpoint_path().as_posix() == "/ckpt/s1/t0007"
    assert spec.probe.with_seed(1008).limits == {"max_seconds_per_task": 2.0, "data_dir": "/data", "seed": 1008}
    repeat = template.for_trial(9, arch, repeat_of=7, recorded={"validation_loss": 3.5})
    assert TrialSpec.from_dict(repeat.to_dict()).recorded == {"validation_loss": 3.5}
    assert template.arch is None  # frozen: for_trial made new specs
