"""benchmarks/surrogate.py and benchmarks/controller_efficiency.py on a synthetic cram table: the
real CSV columns, random members of the CPU space, a loss driven by `position` (rotary best) and a
little by depth, plus seed noise of known size on a few architectures crammed three times. The
scripts run as a user runs them, and their tables are read back."""

from __future__ import annotations

import csv
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from search.analysis import cram_table
from search.study.warm_start import hand_designs
from space import default_space_path, load_space
from tests.helpers import table

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
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


def runs_a_script(test):
    """Each script imports torch and fits boosted trees: seconds to a minute."""
    return pytest.mark.subprocess(pytest.mark.slow(test))


def run(script: str, *args) -> str:
    """What `python benchmarks/<script>.py ARGS` prints."""
    out = subprocess.run([sys.executable, str(BENCHMARKS / f"{script}.py"), *map(str, args)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


def numbers(cell: str) -> list[float]:
    return [float(x) for x in re.findall(r"-?\d+\.\d+", cell)]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return write_table(tmp_path_factory.mktemp("table") / "cram_table.csv")


@pytest.fixture(scope="module")
def fitted(synthetic):
    return run("surrogate", "--table", synthetic, "--folds", 5, "--repeats", 2, "--members", 2000, "--top", 100)


@runs_a_script
def test_the_table_is_read_as_written(fitted):
    [row] = table(fitted, "| rows with a loss |")
    # Every row with a loss, the failed cram skipped; 120 designs and sized-cpu, 16 with 2+ seeds.
    assert row[:4] == [str(120 + 2 * 15 + 3), "1", "121", "16"]


@runs_a_script
def test_surrogate_ranks_held_out_architectures(fitted):
    models = {row[0].removesuffix(" (kept: lower RMSE)"): row for row in table(fitted, "| model | Kendall tau |")}
    assert len(models) == 2
    kept = next(row for row in models.values() if "(kept" in row[0])
    assert float(kept[3]) == min(float(row[3]) for row in models.values())
    tau, low, high = numbers(kept[1])
    assert tau > 0.6 and low <= tau <= high and low > 0.4
    assert numbers(kept[2])[0] > 0.75
    assert float(kept[3]) < 0.15  # the position effect alone spans 0.6 nats


@runs_a_script
def test_position_is_important_and_rotary_is_its_best_value(fitted):
    fields = {row[0]: row for row in table(fitted, "| field | importance (nats) |")}
    assert "position" in list(fields)[:2]
    assert fields["position"][2] == "rotary" and float(fields["position"][4]) > 0.3
    # A field the loss ignores adds next to nothing when shuffled.
    assert float(fields["qkv_bias"][1]) < 0.1 * float(fields["position"][1])
    value, config = re.search(r"Lowest prediction \(table \+ random members\): (\S+), (.*)", fitted).groups()
    assert "rotary" in config and float(value) < 5.15


@runs_a_script
def test_noise_estimate_is_near_the_synthetic_noise(fitted):
    [row] = table(fitted, "| seed-to-seed sd (pooled) |")
    assert row[1] == "16"  # 15 design rows and sized-cpu
    assert 0.6 * NOISE_SD < float(row[0]) < 1.5 * NOISE_SD


@runs_a_script
def test_seed_noise_pools_the_squared_deviations(tmp_path):
    space = load_space(default_space_path("cpu"))
    rng = random.Random(0)
    configs = [space.sample_random(rng) for _ in range(3)]
    path = tmp_path / "cram_table.csv"
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, cram_table.COLUMNS)
        writer.writeheader()
        for index, seed, loss in [(0, 0, 1.0), (0, 1, 3.0), (1, 0, 5.0), (1, 1, 5.0), (1, 2, 8.0), (2, 0, 9.0)]:
            config = configs[index]
            writer.writerow({"key": f"{config.fingerprint()}|{seed}|2e12flops", "source": f"design:{index}", "seed": seed,
                             "budget": "2e12flops", **config.to_dict(), "validation_loss": loss, "error": ""})
    [row] = table(run("surrogate", "--table", path, "--members", 10, "--repeats", 1), "| seed-to-seed sd (pooled) |")
    # a: deviations +-1 (1 df); b: mean 6, deviations -1, -1, 2 (2 df): sqrt((2 + 6) / 3)
    assert row[1] == "2" and float(row[0]) == pytest.approx(math.sqrt(8 / 3), abs=1e-4)


@pytest.fixture(scope="module")
def efficiency(synthetic):
    """Random search, plain and warm+cover, 2 seeds, capped at 10 of 40 trials."""
    return run("controller_efficiency", "--table", synthetic, "--controllers", "random", "--variants", "plain",
               "warm+cover", "--seeds", 2, "--trials", 40, "--cap", "random=10", "--members", 2000)


@runs_a_script
def test_regret_is_never_negative_and_reads_beyond_the_cap_are_dashes(efficiency):
    assert "ran 10 trials per study, not 40 (capped" in efficiency
    assert "below the optimum" not in efficiency  # no winner below the optimum: regret >= 0
    rows = table(efficiency, "| controller | variant | seeds | 10 trials | 32 trials | 40 trials |")  # read at its cap too
    assert [row[:3] for row in rows] == [["random", "plain", "2"], ["random", "warm+cover", "2"]]
    for row in rows:
        median, worst = numbers(row[3])
        assert 0 <= median <= worst
        assert row[4:6] == ["-", "-"]


@runs_a_script
def test_the_winner_is_read_on_the_most_important_fields(efficiency):
    [header] = [line for line in efficiency.splitlines() if line.startswith("| controller | variant | position=rotary")]
    assert len(header.split("|")) == 2 + 2 + 3  # controller, variant and the 3 most important fields


@runs_a_script
def test_warm_start_trains_sized_cpu_first(efficiency):
    sized = dict(hand_designs("cpu"))["sized-cpu"]
    measured, predicted = (float(x) for x in re.search(
        r"measured mean loss (\S+), and below the surrogate's value of it, (\S+):", efficiency).groups())
    assert measured == pytest.approx(true_loss(sized), abs=4 * NOISE_SD)
    rows = {row[1]: row for row in table(efficiency, "| controller | variant | below the measured mean |")}
    for row in rows.values():
        assert all(re.fullmatch(r"(>10|\d+) \([0-2]/2\)", cell) for cell in row[2:])
    # sized-cpu is the first trial: it beats its own measured mean at once exactly when the surrogate says so ...
    assert rows["warm+cover"][2].startswith("1 (2/2)") == (predicted < measured)
    assert not rows["warm+cover"][3].startswith("1 (")  # ... and nothing is below its own value


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
    assert cram_table.row_id(planned) in cram_table.table_store(table).done
    crams, _ = cram_table.read_crams(table)
    assert crams[0].architecture == config.fingerprint() == crams[4].architecture  # seeds 0 and 1 of design:0
