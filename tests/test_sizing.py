"""search.sizing: a design at other sizes, the compute-optimal size fit and its errors, the size
chosen for a target budget, and the resumable CLI (issue 26 §2)."""

from __future__ import annotations

import json
import math
import random
from dataclasses import fields

import pytest
import yaml

from search.sizing import (
    DEFAULT_SIZES,
    BudgetBest,
    SizeFit,
    SizingError,
    best_size,
    fit_lines,
    fit_size,
    heads_for,
    load_size_fit,
    main,
    non_embedding_params,
    size_family,
)
from space.arch import ArchConfig, ArchError
from tests.helpers import CONFIGS
from trainer.config import load_run_config

SIZE_FIELDS = {"layers", "hidden", "heads"}
CPU_CONFIGS = ["sized-cpu", "crammed-bert-cpu", "neobert-cpu", "modernbert-cpu", "bert-original-cpu"]
SIZED_CPU = CONFIGS / "sized-cpu.yaml"

# Chinchilla's loss in N and tokens D (Hoffmann et al. 2022, approach 3's fitted constants):
# L = E + A / N^alpha + B / D^beta with D = C / 6N, whose optimum is N_opt = G (C/6)^(beta/(alpha+beta)).
E, A, B, ALPHA, BETA = 1.69, 406.4, 410.7, 0.34, 0.28
TRUE_EXPONENT = BETA / (ALPHA + BETA)
GRID_N = [1e3 * 2 ** k for k in range(16)]  # 1k to 33M, a factor 2 apart


def chinchilla_optimum(budget: float) -> float:
    g = (ALPHA * A / (BETA * B)) ** (1 / (ALPHA + BETA))
    return g * (budget / 6) ** TRUE_EXPONENT


def chinchilla_rows(budgets, grid=GRID_N):
    return [{"budget_flops": c, "size": f"s{k}", "non_embedding_params": n,
             "validation_loss": E + A / n ** ALPHA + B / (c / (6 * n)) ** BETA}
            for c in budgets for k, n in enumerate(grid)]


def test_fit_recovers_the_exponent_and_predicts_a_budget_it_did_not_see():
    fit = fit_size(chinchilla_rows([1e12, 3e12, 1e13, 3e13]))
    assert fit.exponent == pytest.approx(TRUE_EXPONENT, abs=0.01)
    assert all(best.method == "parabola" and not best.edge for best in fit.best)
    held_out = 1e14  # 3x beyond the largest crammed budget
    assert fit.predict(held_out) == pytest.approx(chinchilla_optimum(held_out), rel=0.05)
    # ... and against what crams at that budget would have found, the way the fit measures a budget
    measured = best_size(held_out, sorted((row["non_embedding_params"], row["validation_loss"], row["size"])
                                          for row in chinchilla_rows([held_out]))).params
    assert fit.predict(held_out) == pytest.approx(measured, rel=0.05)
    assert len(fit.held_out) == 4 and fit.held_out_error < 0.05 and fit.residual_error < 0.05


def test_fit_to_noisy_losses_stays_near_a_known_power_law():
    # Losses that are a parabola in ln N about N_opt = 3 C^0.6, plus noise of 0.005 nats.
    rng, grid = random.Random(0), [2e3 * 2 ** k for k in range(12)]
    rows = [{"budget_flops": c, "size": f"s{n:.0f}", "non_embedding_params": n,
             "validation_loss": 4.0 + 0.1 * math.log(n / (3 * c ** 0.6)) ** 2 + rng.gauss(0, 0.005)}
            for c in (1e6, 4e6, 1.6e7, 6.4e7, 2.56e8) for n in grid]
    fit = fit_size(rows)
    assert fit.exponent == pytest.approx(0.6, abs=0.05)
    assert fit.exponent_error < 0.05
    assert fit.predict(1e9) == pytest.approx(3 * 1e9 ** 0.6, rel=0.25)


def test_best_size_at_an_end_of_the_grid_is_the_argmin_and_says_which_end():
    points = [(1e3, 5.0, "a"), (4e3, 5.2, "b"), (1.6e4, 5.5, "c")]
    best = best_size(2e12, points)
    assert (best.size, best.params, best.method, best.edge) == ("a", 1e3, "argmin", "smallest")
    best = best_size(2e12, [(2e3, 5.6, "z"), (1.6e4, 5.3, "c")])  # lowest at the larger end
    assert best.edge == "largest" and best.size == "c"
    inside = best_size(2e12, [(1e3, 5.2, "a"), (4e3, 5.0, "b"), (1.6e4, 5.2, "c")])
    assert inside.method == "parabola" and inside.params == pytest.approx(4e3)  # symmetric: the vertex is b


def test_fit_needs_two_budgets_and_leaves_out_failed_crams():
    rows = chinchilla_rows([1e12, 1e13])
    two = fit_size(rows)
    assert two.residual_error is None and two.held_out == () and two.held_out_error is None
    with pytest.raises(SizingError, match="two or more"):
        fit_size(chinchilla_rows([1e12]))
    # The lowest loss of 1e13, failed: the fit must take the best of what remains.
    best_at_1e13 = next(b for b in two.best if b.budget_flops == 1e13).size
    failed = [{**row, "validation_loss": None} if (row["budget_flops"], row["size"]) == (1e13, best_at_1e13) else row
              for row in rows]
    assert next(b for b in fit_size(failed).best if b.budget_flops == 1e13).size != best_at_1e13


def test_fit_to_dict_is_plain_yaml_for_a_provenance():
    fit = fit_size(chinchilla_rows([1e12, 3e12, 1e13]))
    record = yaml.safe_load(yaml.safe_dump({"provenance": {"size_fit": fit.to_dict()}}))["provenance"]["size_fit"]
    assert record["exponent"] == pytest.approx(fit.exponent)
    assert record["budgets"] == [1e12, 3e12, 1e13] and len(record["best"]) == 3 and len(record["held_out"]) == 3
    assert record["measure"] == "non_embedding_params" and record["grid"][0] == "s0"
    assert record["held_out_error_ln"] == pytest.approx(fit.held_out_error)


def test_a_written_fit_loads_back(tmp_path):
    fit = fit_size(chinchilla_rows([1e12, 3e12, 1e13]))
    path = tmp_path / "size-fit.json"
    path.write_text(json.dumps({"config": "x", **fit.to_dict()}))
    assert load_size_fit(path) == fit
    path.write_text(json.dumps({"exponent": 0.5}))
    with pytest.raises(SizingError, match="not one search.sizing wrote"):
        load_size_fit(path)
    with pytest.raises(SizingError, match="nope.json"):
        load_size_fit(tmp_path / "nope.json")


@pytest.mark.parametrize("name", CPU_CONFIGS)
def test_size_family_keeps_every_non_size_field(name):
    design = load_run_config(CONFIGS / f"{name}.yaml").arch
    family = size_family(design)
    assert [f"{a.layers}x{a.hidden}" for a in family] == list(DEFAULT_SIZES)
    for arch in family:
        assert {f.name: getattr(arch, f.name) for f in fields(arch) if f.name not in SIZE_FIELDS} == \
               {f.name: getattr(design, f.name) for f in fields(design) if f.name not in SIZE_FIELDS}
        assert ArchConfig.from_dict(arch.to_dict()) == arch  # a valid config
        if arch.hidden % design.head_dim == 0:
            assert arch.head_dim == design.head_dim
    sizes = [non_embedding_params(arch) for arch in family]
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)  # the default grid is one chain in N


@pytest.mark.parametrize("hidden, head_dim, rotary, heads", [
    (128, 32, True, 4),  # divides: the design's head dim
    (16, 32, True, 1),  # narrower than a head: one head of all of it
    (64, 48, False, 1),  # 32 or 64: 64 is nearer 48 by ratio
    (54, 8, False, 6),  # 9 is nearest ...
    (54, 8, True, 9),  # ... but odd: rotary takes 6
])
def test_heads_keep_the_head_dim_nearest_the_design(hidden, head_dim, rotary, heads):
    assert heads_for(hidden, head_dim, rotary) == heads


def test_an_impossible_size_is_named():
    design = load_run_config(SIZED_CPU).arch  # rotary
    with pytest.raises(ArchError, match="size 1x33"):
        size_family(design, ["1x32", "1x33"])


def sized_cpu_fit(exponent: float = 0.5) -> tuple[ArchConfig, dict[str, float], SizeFit]:
    """sized-cpu's design, the N of each default size, and a fit crammed at 1e11 and 1e13 FLOPs whose
    prediction at 1e12 is exactly 2x64's N."""
    design = load_run_config(SIZED_CPU).arch
    n = {f"{a.layers}x{a.hidden}": non_embedding_params(a) for a in size_family(design)}
    best = (BudgetBest(1e11, "1x32", 1e4, "parabola"), BudgetBest(1e13, "2x128", 3e5, "parabola"))
    return design, n, SizeFit(exponent, n["2x64"] / 1e12 ** exponent, best, DEFAULT_SIZES)


def test_config_for_takes_the_grid_size_nearest_the_prediction_in_log_n():
    design, n, fit = sized_cpu_fit()
    exact = fit.choose(design, 1e12)
    assert (exact.size, exact.beyond_grid, exact.beyond_budgets, exact.warning) == ("2x64", "", False, None)
    # N between 2x64 and 2x128, nearer one or the other in ln N (C = (N / a)^(1/b))
    for share, expected in ((0.4, "2x64"), (0.6, "2x128")):
        between = n["2x64"] ** (1 - share) * n["2x128"] ** share
        arch = fit.config_for(design, (between / fit.coefficient) ** (1 / fit.exponent))
        assert f"{arch.layers}x{arch.hidden}" == expected
        assert arch.replace(layers=design.layers, hidden=design.hidden, heads=design.heads) == design
    custom = fit.choose(design, 1e12, sizes=["1x32", "4x192"])  # another grid to choose from
    assert custom.size == "1x32" and custom.beyond_grid == ""


def test_config_for_outside_the_grid_takes_its_end_and_flags_it():
    design, n, fit = sized_cpu_fit()
    above = fit.choose(design, 1e16)
    assert (above.size, above.beyond_grid, above.beyond_budgets) == ("4x128", "above", True)
    assert "4x128" in above.warning and "larger sizes" in above.warning
    below = fit.choose(design, 1e6)
    assert (below.size, below.beyond_grid) == ("1x16", "below") and "smallest" in below.warning
    assert yaml.safe_load(yaml.safe_dump(above.to_dict()))["beyond_grid"] == "above"
    # A flat fit at an end of the grid (every budget's best, the smallest size) is at it, not beyond it.
    flat = SizeFit(0.0, float(n["1x16"]), fit.best, DEFAULT_SIZES)
    assert flat.choose(design, 1e15).beyond_grid == ""


def test_a_fit_with_every_best_at_the_grid_end_warns():
    rows = [{"budget_flops": c, "size": size, "non_embedding_params": n, "validation_loss": loss}
            for c in (1e12, 1e13) for size, n, loss in (("a", 1e3, 5.0), ("b", 4e3, 5.1), ("c", 1.6e4, 5.2))]
    assert any(line.startswith("warning: every budget's best") for line in fit_lines(fit_size(rows)))
    interior = fit_size(chinchilla_rows([1e12, 1e13]))
    assert not any(line.startswith("warning") for line in fit_lines(interior))


# ---- the CLI -----------------------------------------------------------------------------------

def _no_training(*args, **kwargs):
    raise AssertionError("training or data preparation started despite bad input")


@pytest.mark.parametrize("flags, named", [
    (["--budgets", "60s,2e12flops"], "--budgets"),  # a wall-clock budget: not the same compute for every size
    (["--budgets", "180refs,2e12flops"], "--budgets"),
    (["--budgets", "2e12,6e12flops"], "--budgets"),  # no unit
    (["--budgets", "2e12flops"], "--budgets"),  # one budget: no fit
    (["--budgets", "2e12flops,2000e9flops"], "--budgets"),  # one budget, twice
    (["--budgets", "2e12flops,6e12flops", "--sizes", "1x32,2by64"], "--sizes"),
    (["--budgets", "2e12flops,6e12flops", "--sizes", "1x32,1x33"], "--sizes"),  # rotary: no even head dim
    (["--budgets", "2e12flops,6e12flops", "--sizes", "1x32"], "--sizes"),
    (["--budgets", "2e12flops,6e12flops", "--sizes", "1x32,1x32"], "--sizes"),
    (["--budgets", "2e12flops,6e12flops", "--target", "24h"], "--target"),
    (["--budgets", "2e12flops,6e12flops", "--threads", "0"], "--threads"),
])
def test_bad_flags_are_one_line_naming_the_flag_before_any_work(flags, named, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("search.sizing.prepare", _no_training)
    monkeypatch.setattr("search.sizing.cram_row", _no_training)
    out = tmp_path / "sizing"
    code = main(["--config", str(SIZED_CPU), *flags, "--data", str(tmp_path), "--out", str(out)])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err
    assert errors[0].startswith(f"error: {named}: ")
    assert not out.exists()


def test_a_missing_config_is_one_line(tmp_path, capsys):
    code = main(["--config", str(tmp_path / "nope.yaml"), "--budgets", "2e12flops,6e12flops", "--data", str(tmp_path)])
    assert code == 2 and "nope.yaml" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_crams_each_size_and_budget_once_and_writes_the_fit(wiki_slice_dir, slice_cache, tmp_path, capsys,
                                                                 monkeypatch):
    import trainer.cram

    crammed: list[str] = []
    real_cram = trainer.cram.cram

    def counting_cram(arch, train, data, budget, **kwargs):
        crammed.append(f"{arch.layers}x{arch.hidden}@{budget.text}")
        return real_cram(arch, train, data, budget, **kwargs)

    monkeypatch.setattr("trainer.cram.cram", counting_cram)
    out = tmp_path / "sizing"
    # sized-cpu is at the slice's vocabulary and row length; tiny budgets: a few steps each.
    common = ["--config", str(SIZED_CPU), "--sizes", "1x16,1x32,1x64", "--data", str(wiki_slice_dir),
              "--cache-dir", str(slice_cache), "--out", str(out)]
    assert main([*common, "--budgets", "2e9flops,4e9flops"]) == 0
    assert len(crammed) == 6 and len((out / "crams.jsonl").read_text().splitlines()) == 6
    first = json.loads((out / "size-fit.json").read_text())
    assert first["budgets"] == [2e9, 4e9] and first["held_out"] == []

    # A third budget: only its three crams run, the first six are read back.
    assert main([*common, "--budgets", "2e9flops,4e9flops,8e9flops", "--target", "1e12flops"]) == 0
    assert sorted(crammed[6:]) == ["1x16@8e9flops", "1x32@8e9flops", "1x64@8e9flops"]
    rows = [json.loads(line) for line in (out / "crams.jsonl").read_text().splitlines()]
    assert len(rows) == 9 and len({row["key"] for row in rows}) == 9
    assert all(row["validation_loss"] > 0 and row["tokens"] > 0 for row in rows)
    one = next(row for row in rows if row["size"] == "1x64")
    assert one["params"] == ArchConfig.from_dict(one["arch"]).num_params() and one["heads"] == 2
    fit = json.loads((out / "size-fit.json").read_text())
    assert fit["budgets"] == [2e9, 4e9, 8e9] and len(fit["best"]) == 3 and len(fit["held_out"]) == 3
    assert fit["grid"] == ["1x16", "1x32", "1x64"] and fit["config"] == "sized-cpu"
    assert fit["target"]["size"] in fit["grid"] and math.isfinite(fit["exponent"])
    printed = capsys.readouterr().out
    assert "| size | N | 2e9flops | 4e9flops | 8e9flops |" in printed and "fit: N_opt = " in printed

    # Everything is there: a third call crams nothing and fits the same.
    monkeypatch.setattr("trainer.cram.cram", _no_training)
    assert main([*common, "--budgets", "2e9flops,4e9flops,8e9flops"]) == 0
    assert "0 crams to run (9 in" in capsys.readouterr().out
    assert len((out / "crams.jsonl").read_text().splitlines()) == 9
    assert json.loads((out / "size-fit.json").read_text())["exponent"] == pytest.approx(fit["exponent"])


def test_export_writes_the_winning_design_at_the_size_the_fit_picks_for_the_target(tmp_path, capsys):
    from search import export
    from tests.dashboard_study import scratch_store, write_study

    _, _, fit = sized_cpu_fit()  # at 1e12 FLOPs it predicts 2x64's N exactly
    fit_file = tmp_path / "size-fit.json"
    fit_file.write_text(json.dumps({"config": "synthetic", **fit.to_dict()}))
    with scratch_store("cramnas-sizing-") as uri:
        study = write_study(uri, "sized", 4, controller="random", objective="mlm", seed=1)
        out = tmp_path / "best.yaml"
        flags = ["--study", "sized", "--tracking-uri", uri, "--out", str(out), "--force"]
        assert export.main([*flags, "--target-budget", "1e12flops", "--size-fit", str(fit_file)]) == 0
        exported = yaml.safe_load(out.read_text())
        winner = ArchConfig.from_dict({**ArchConfig().to_dict(), **study.trials[exported["provenance"]["trial"]].arch})
        expected = fit.choose(winner, 1e12).arch
        assert exported["arch"] == expected.to_dict() and exported["name"] == "sized-best"
        assert f"{expected.layers}x{expected.hidden}" == "2x64" != f"{winner.layers}x{winner.hidden}"
        sizing = exported["provenance"]["sizing"]
        assert sizing["target_budget"] == "1e12flops" and sizing["size_fit"]["exponent"] == pytest.approx(fit.exponent)
        assert "sized for 1e12flops: 2x64" in capsys.readouterr().out
        for extra, message in ((["--target-budget", "1e12flops"], "--target-budget: needs --size-fit"),
                               (["--target-budget", "60s", "--size-fit", str(fit_file)],
                                "60s is seconds; the fit is over compute"),
                               (["--size-fit", str(fit_file)], "--size-fit: only with --target-budget")):
            assert export.main([*flags, *extra]) == 2
            assert message in capsys.readouterr().err
