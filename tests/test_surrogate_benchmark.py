"""benchmarks/surrogate.py and benchmarks/controller_efficiency.py on a synthetic cram table: the
real CSV columns, random members of the CPU space, a loss driven by `position` (rotary best) and a
little by depth, plus seed noise of known size on a few architectures crammed three times."""

from __future__ import annotations

import csv
import math
import random
import sys
from pathlib import Path

import numpy as np
import optuna
import pytest
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import controller_efficiency  # noqa: E402
import cram_table  # noqa: E402
import surrogate as surrogates  # noqa: E402

from search.study.warm_start import hand_designs  # noqa: E402
from space import default_space_path, load_space  # noqa: E402

NOISE_SD = 0.02
POSITION_COST = {"rotary": 0.0, "alibi": 0.25, "scaled_sinusoidal": 0.3, "sinusoidal": 0.35, "learned": 0.4,
                 "none": 0.6}


def true_loss(config) -> float:
    return 5.0 + POSITION_COST[config.position] + 0.03 * (config.layers - 3) ** 2


def write_table(path: Path, architectures: int = 120, repeated: int = 15, seed: int = 0) -> Path:
    """`architectures` random members, seed 0; the first `repeated` again with seeds 1 and 2; a
    sized-cpu row (3 seeds) and one failed cram, as the real table has."""
    space = load_space(default_space_path("cpu"))
    rng, noise = random.Random(seed), np.random.default_rng(seed)
    configs = [space.sample_random(rng) for _ in range(architectures)]
    plan = [(f"design:{i}", c, 0) for i, c in enumerate(configs)]
    plan += [(f"design:{i}", c, s) for i, c in enumerate(configs[:repeated]) for s in (1, 2)]
    sized = dict(hand_designs("cpu"))["sized-cpu"]
    plan += [("hand:sized-cpu", sized, s) for s in (0, 1, 2)]
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, cram_table.COLUMNS)
        writer.writeheader()
        for source, config, s in plan:
            writer.writerow({"key": f"{config.fingerprint()}|{s}|2e12flops", "source": source, "seed": s,
                             "budget": "2e12flops", **config.to_dict(),
                             "validation_loss": true_loss(config) + noise.normal(0, NOISE_SD), "regime": "neighbours",
                             "params": config.num_params(), "error": ""})
        writer.writerow({"key": f"{configs[0].fingerprint()}|9|2e12flops", "source": "design:0", "seed": 9,
                         "budget": "2e12flops", **configs[0].to_dict(), "error": "RuntimeError: out of memory"})
    return path


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    table = write_table(tmp_path_factory.mktemp("table") / "cram_table.csv")
    with threadpool_limits(1):
        return surrogates.fit(table, folds=5, repeats=2, members=2000, boot=200)


def test_the_table_is_read_as_written(fitted):
    assert fitted.skipped == 1  # the failed cram
    assert len(fitted.crams) == 120 + 2 * 15 + 3
    assert len(fitted.configs) == 121 and fitted.losses.shape == (121,)
    sized = dict(hand_designs("cpu"))["sized-cpu"]
    assert sized in fitted.configs
    assert surrogates.source_mean(fitted.crams, "hand:sized-cpu") == pytest.approx(true_loss(sized), abs=4 * NOISE_SD)


def test_surrogate_ranks_held_out_architectures(fitted):
    assert set(fitted.quality) == set(surrogates.MODELS)
    kept = fitted.quality[fitted.model_name]
    assert kept.rmse == min(q.rmse for q in fitted.quality.values())
    tau, low, high = kept.kendall
    assert tau > 0.6 and low <= tau <= high and low > 0.4
    assert kept.spearman[0] > 0.75
    assert kept.rmse < 0.15  # the position effect alone spans 0.6 nats


def test_position_is_important_and_rotary_is_its_best_value(fitted):
    assert "position" in fitted.top_fields(2)
    best, mean, spread = fitted.best_value("position")
    assert best == "rotary" and spread > 0.3
    # A field the loss ignores adds next to nothing when shuffled.
    importance = dict(fitted.importance)
    assert importance["qkv_bias"] < 0.1 * importance["position"]
    value, config = fitted.optimum()
    assert config.position == "rotary" and value < 5.15


def test_noise_estimate_is_near_the_synthetic_noise(fitted):
    assert fitted.noise_architectures == 16  # 15 design rows and sized-cpu
    assert 0.6 * NOISE_SD < fitted.noise_sd < 1.5 * NOISE_SD


def test_seed_noise_pools_the_squared_deviations():
    rows = [surrogates.Cram(a, "design:0", s, None, loss) for a, s, loss in
            [("a", 0, 1.0), ("a", 1, 3.0), ("b", 0, 5.0), ("b", 1, 5.0), ("b", 2, 8.0), ("c", 0, 9.0)]]
    sd, count = surrogates.seed_noise(rows)
    # a: deviations +-1 (1 df); b: mean 6, deviations -1, -1, 2 (2 df): sqrt((2 + 6) / 3)
    assert count == 2 and sd == pytest.approx(math.sqrt(8 / 3))


def test_random_search_regret_is_non_negative_and_falls_without_noise(fitted):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    optimum, _ = fitted.optimum()
    exact = controller_efficiency.benchmark(fitted, "random", "plain", seeds=2, trials=20, noise_sd=0.0)
    assert [len(s.true) for s in exact.studies] == [20, 20]
    curves = np.array([exact.regrets(t, optimum) for t in range(1, 21)]).T  # (seeds, trials)
    for study, regrets in zip(exact.studies, curves, strict=True):
        assert all(r >= 0 for r in regrets)
        assert all(later <= earlier for earlier, later in zip(regrets, regrets[1:]))
        assert regrets[-1] == pytest.approx(min(study.true) - optimum)
    noisy = controller_efficiency.benchmark(fitted, "random", "plain", seeds=2, trials=20)
    for trials in (5, 10, 20):
        assert (noisy.regrets(trials, optimum) >= 0).all()
    # Same seeds, same sampler: the architectures are the same; only what was observed differs.
    assert [s.configs for s in noisy.studies] == [s.configs for s in exact.studies]
    assert [s.observed for s in noisy.studies] != [s.true for s in noisy.studies]


def test_warm_and_cover_trials_come_first(fitted):
    outcome = controller_efficiency.benchmark(fitted, "random", "warm+cover", seeds=1, trials=12)
    configs = outcome.studies[0].configs
    hands = [config for _, config in hand_designs("cpu")]
    assert configs[:len(hands)] == hands
    # The covering design follows: every position within its 7 trials.
    assert {c.position for c in configs[len(hands):len(hands) + 7]} == set(POSITION_COST)
    sized = surrogates.source_mean(fitted.crams, "hand:sized-cpu")
    predicted_sized = fitted.predict([dict(hand_designs("cpu"))["sized-cpu"]])[0]
    # sized-cpu is the first trial: it beats its own measured mean at once exactly when the surrogate says so.
    assert (outcome.trials_to_beat(sized)[0] == 1) == (predicted_sized < sized)
    assert outcome.trials_to_beat(predicted_sized)[0] != 1  # nothing is below its own value


def test_report_names_the_fields_and_the_cap(fitted, tmp_path):
    plain = controller_efficiency.benchmark(fitted, "random", "plain", seeds=2, trials=10)
    text = controller_efficiency.report(fitted, [plain], trials=40, table=tmp_path / "t.csv")
    assert "ran 10 trials per study, not 40 (capped" in text
    assert "position=rotary" in text
    assert "| controller | variant | below the measured mean | below the prediction |" in text
    assert "| 10 trials | 32 trials | 40 trials |" in text  # read at its cap too
    assert "| random | plain | 2 | " in text and "| - | - |" in text  # reads beyond the cap are "-"
    assert controller_efficiency.median_trials([3, None, None], 10) == ">10"
    assert controller_efficiency.median_trials([3, 5, None], 10) == "5"


def test_a_respelled_fingerprint_neither_recrams_nor_splits_an_architecture(tmp_path):
    """A row whose stored key has yesterday's fingerprint (before `ArchConfig.canonical` respelled
    a window that changes no layer) is the same cram to a resume and the same architecture to the
    surrogate."""
    table = write_table(tmp_path / "cram_table.csv", architectures=4, repeated=1)
    rows = list(csv.DictReader(table.open()))
    rows[0]["key"] = "0ldf1ngerpr1|" + rows[0]["key"].split("|", 1)[1]
    with table.open("w", newline="") as file:
        writer = csv.DictWriter(file, cram_table.COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    space = load_space(default_space_path("cpu"))
    config = space.sample_random(random.Random(0))  # write_table's first architecture
    planned = {"key": f"{config.fingerprint()}|0|2e12flops", "source": "design:0", "seed": 0, "arch": config}
    assert cram_table.row_id(planned) in cram_table.read_table(table)
    crams, _ = surrogates.read_crams(table)
    assert crams[0].architecture == config.fingerprint() == crams[4].architecture  # seeds 0 and 1 of design:0
