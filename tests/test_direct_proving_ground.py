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
    late = {**job(tmp_path, wiki_slice_dir, slice_cache, 2), "deadline": time.time()}  # no trial starts after it
    assert drive(late) == ("pg-tpe-s0: 0 complete, 0 failed; "
                           "the deadline (--deadline-s) came at 0 of 2 trials: the same command goes on")
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


def test_the_table_pays_back_the_study_alone_and_the_whole_path_with_the_confirmations(monkeypatch, tmp_path):
    import json

    import direct_proving_ground
    from accounting import Crams

    from trainer.budget import Budget

    def row(name, multiple, seed, loss):
        return {"key": f"{name}|{multiple:g}x|{seed}", "name": name, "validation_loss": loss, "tokens": 1000 * multiple,
                "flops_per_token": 2e9, "corruption_floor": 5.856, "context_reference": 3.192, "device": "cpu",
                "seconds": 1.0}

    rows = [row("sized-cpu", 1, s, 5.0) for s in range(3)] + [row("sized-cpu", 2, 0, 4.5), row("sized-cpu", 4, 0, 4.0)]
    rows += [row("pg-gp-s0", m, s, 4.5 if m == 1 else 4.2) for m in (1, 3) for s in range(3)]
    (tmp_path / "crams.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    crams = Crams(tmp_path, "d", None, Budget.parse("2e12flops"), 1)
    # the study spent 10 final runs (a final run: 1000 tokens x 2e9 = 2e12 FLOPs); the winner's 4.5 is sized-cpu at 2x
    monkeypatch.setattr(direct_proving_ground, "study_compute",
                        lambda storage, name: {"flops": 2e13, "trials": 10, "device_seconds": 0.0})
    arch = {"layers": 1, "hidden": 32, "heads": 1, "ffn_mult": 2.0, "vocab_size": 2048, "max_seq_len": 64}
    configs = {"sized-cpu": (arch, {}), "pg-gp-s0": (arch, {})}
    text = direct_proving_ground.table(crams, configs, ["pg-gp-s0"], str(tmp_path), Budget.parse("2e12flops"),
                                       (1, 2, 4), (1, 3))
    line = next(line for line in text.splitlines() if line.startswith("| pg-gp-s0"))
    assert "| 2.00x |" in line
    assert "| -0.500 ± 0.000 outside noise | – |" in line  # no sized-cpu at 3x: nothing to pair the winner's 3x with
    assert "10.0 runs (10 trials = 10 finals)" in line  # 10 finals / (2 - 1)
    assert "22.0 runs (with the confirmations = 22 finals)" in line  # + 3 seeds at 1x and 3 at 3x: 3 + 9 finals
    short = direct_proving_ground.table(crams, configs, ["pg-gp-s0"], str(tmp_path), Budget.parse("2e12flops"), (1,), (1, 3))
    line = next(line for line in short.splitlines() if line.startswith("| pg-gp-s0"))
    assert "| >1x | not measured (multiple beyond the curve's 1x) |" in line  # not "never": the curve stops at 1x
