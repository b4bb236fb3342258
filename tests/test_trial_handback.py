"""A clean hand-back between trials (issue 20, section 4): a trial frees its model however it ends,
ASHA's stop included, and nothing on the CPU path initialises CUDA: on a GPU host a CUDA context
(hundreds of MB on GPU 0) would sit beside the trials Ray placed there."""

from __future__ import annotations

import weakref

import pytest
import torch

import search.study.trial
from search.run import repeat_warning_for_study
from search.study.local_executor import TrialStopped
from search.study.spec import TrialSpec
from space import load_space
from space.arch import ArchConfig
from tests.helpers import ROOT, SLICE_SEQ, SLICE_VOCAB
from trainer import loop
from trainer.budget import Budget
from trainer.config import TrainConfig
from trainer.cram import cram

ARCH = ArchConfig(layers=1, hidden=32, heads=2, ffn_mult=2.0, vocab_size=SLICE_VOCAB, max_seq_len=SLICE_SEQ)
TRAIN = TrainConfig(batch_size=8, micro_batch=4, seed=0, report_every=0.25)
SPACE = load_space(ROOT / "tests" / "search_files" / "tiny_space.yaml")


@pytest.fixture
def gpu_host(monkeypatch):
    """A GPU host as CUDA's lazy initialisation sees it, on this CPU-only build: CUDA looks
    available, and initialising it is recorded (and fails, as it would on the real thing for lack
    of a driver here)."""
    initialised = []

    def lazy_init():
        initialised.append(True)
        raise RuntimeError("CUDA initialised")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "_lazy_init", lazy_init)
    return initialised


def test_a_cpu_cram_on_a_gpu_host_never_initialises_cuda(wiki_slice, gpu_host):
    # trainer/resume.py took the CUDA RNG states at every step whenever CUDA was available.
    result = cram(ARCH, TRAIN, wiki_slice, Budget.parse(f"{8 * 4 * SLICE_SEQ}tokens"), device=torch.device("cpu"))
    assert result.steps > 0 and gpu_host == [] and not torch.cuda.is_initialized()


def test_the_drivers_speed_probe_for_cpu_trials_never_initialises_cuda(wiki_slice, gpu_host):
    # A wall-clock budget times the cheapest architecture before the study: on the trials' device.
    warning = repeat_warning_for_study(Budget.parse("168h"), SPACE, TrainConfig(micro_batch=8), wiki_slice, 0)
    assert warning is not None and "timed before training" in warning
    assert gpu_host == [] and not torch.cuda.is_initialized()


@pytest.mark.parametrize("stop", [SystemExit(0), TrialStopped()], ids=["ray", "local"])
def test_a_trial_asha_stops_frees_its_model_before_the_worker_moves_on(stop, wiki_slice, monkeypatch):
    """Ray stops a trial by raising SystemExit(0) inside its `tune.report`, the local executor by
    raising TrialStopped in its report: the model must not outlive the trial, whose frames that
    exception's traceback holds."""
    models = []
    build = loop.CrammedBert

    def tracked(*args, **kwargs):
        model = build(*args, **kwargs)
        models.append(weakref.ref(model))
        return model

    def report(metrics):
        if not metrics["final"]:
            raise stop  # what ray.train's session, or the local worker, does when early stopping says stop

    monkeypatch.setattr(loop, "CrammedBert", tracked)
    monkeypatch.setattr(search.study.trial, "open_prepared", lambda *args: (wiki_slice, "cache"))
    spec = TrialSpec(TRAIN, Budget.parse(f"{16 * 4 * SLICE_SEQ}tokens"), wiki_slice.fingerprint, arch=ARCH,
                     trial_number=0)
    with pytest.raises(type(stop)) as stopped:  # noqa: F841 - kept: its traceback holds the frames
        search.study.trial.execute_trial(spec.to_dict(), report)
    assert len(models) == 1
    assert models[0]() is None  # with the frames' variables still held by `stopped`, it would be alive
