"""A finished study written straight to MLflow as `search.run` records it, for the tests of
`search.confirm` (tests/test_confirm.py, tests/test_baselines.py): much faster than running one."""

from __future__ import annotations

from search.tracking.tracker import StudyTracker
from space.arch import ArchConfig
from tests.helpers import ROOT
from trainer.config import load_run_config

TRAIN = {**load_run_config(ROOT / "trainer" / "configs" / "crammed-bert-cpu.yaml").train.to_dict(),
         "micro_batch": 8, "batch_size": 16, "seed": 7}
SEEDS = [7 + 1001, 7 + 1002]  # train.seed + 1000 + k
BUDGET = "3e3tokens"


def tiny_arch(**changes) -> dict:
    fields = {"layers": 1, "hidden": 32, "heads": 2, "ffn_mult": 2.0, "vocab_size": 2048, "max_seq_len": 64,
              "sparse_prediction": True, **changes}
    return ArchConfig(**fields).to_dict()


def write_study(uri: str, name: str, trials: list[tuple[dict, str, dict]], objective: str = "mlm",
                probe_tasks: str = "", probe_limits: dict | None = None, artifacts: bool = True) -> dict[int, str]:
    """A finished study as search.run records it; trials are (arch, cramnas state, metrics).
    `artifacts=False`: runs as `--resume` rebuilds them from the study store, without arch.yaml.
    Returns trial number -> run id."""
    tracker = StudyTracker(uri, name)
    tracker.start_study({"controller": "random", "objective": objective, "budget": "2e4tokens", "trials": len(trials),
                         "train": TRAIN, "probe_tasks": probe_tasks, "probe_limits": probe_limits or {}})
    runs = {}
    for number, (arch, state, metrics) in enumerate(trials):
        runs[number] = tracker.open_trial_run(number, arch, TRAIN, f"fp{number}")
        tracker.finish_run(runs[number], state, {**metrics, "tokens": 19968},
                           artifacts={"arch.yaml": arch} if artifacts else {})
    tracker.finish_study()
    return runs
