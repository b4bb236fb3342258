"""search.transfer (python -m search.transfer) on made-up crams (the real measurement takes hours): the tables' rank
correlations, count-model marks, best-at-1x against best-at-30x and the ladder pick's verdicts; the
resized hand designs; a second call cramming nothing; bad input as one line and exit 2."""

from __future__ import annotations

import concurrent.futures
import json
import re
from pathlib import Path

import optuna
import pytest

from search import transfer
from search.analysis import crams as cram_store
from search.analysis import transfer as analysis
from search.base.paths import CONFIGS
from space.arch import ArchConfig
from space.errors import UsageError
from trainer.budget import Budget
from trainer.config import load_run_config

MULTIPLES = (1.0, 3.0, 10.0, 30.0)
SEEDS_AT = {1.0: 3, 3.0: 3, 10.0: 3, 30.0: 1}
SIZED_CPU = load_run_config(CONFIGS / "sized-cpu.yaml")
ARCH = SIZED_CPU.arch.to_dict()
CONTEXT = 3.0  # the made-up two-neighbour count model


def cram_row(name: str, multiple: float, seed: int, loss: float) -> dict:
    """A line of crams.jsonl as search.analysis.crams.cram_job writes it, with what the transfer reads."""
    return {"key": f"{name}|{multiple:g}x|{seed}", "name": name, "validation_loss": loss, "seconds": 1.0,
            "tokens": 1000, "flops_per_token": 1e6, "corruption_floor": 5.8, "context_reference": CONTEXT,
            "unigram_floor": 6.4, "regime": "neighbours", "epochs": 0.3 * multiple * (1 + seed)}


def made_up(tmp_path: Path, curves: dict[str, dict[float, list[float]]], kinds: dict[str, str] | None = None):
    """Fixed configurations whose seeds 0, 1, ... scored `curves[name][multiple]`, their crams in
    tmp_path/crams.jsonl, and the cells the transfer reads from them."""
    rows = [cram_row(name, m, seed, loss) for name, curve in curves.items() for m, losses in curve.items()
            for seed, loss in enumerate(losses)]
    (tmp_path / "crams.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    kinds = kinds or {}
    configs = [transfer.Configuration.fixed(name, kinds.get(name, "candidate"), ARCH, {}, MULTIPLES)
               for name in curves]
    crams = cram_store.Crams(tmp_path, "data", None, Budget.parse("2e12flops"), jobs=1)
    return configs, analysis.cells(crams, configs, SEEDS_AT)


def seeds(*means: float, spread: float = 0.01) -> dict[float, list[float]]:
    """A curve over MULTIPLES with SEEDS_AT seeds about each mean."""
    return {m: [mean + spread * (s - (SEEDS_AT[m] - 1) / 2) for s in range(SEEDS_AT[m])]
            for m, mean in zip(MULTIPLES, means)}


def table_row(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {name} |"))


def test_each_rung_is_ranked_against_30x_over_the_fixed_configurations_with_intervals(tmp_path):
    # 1x ranks as 30x does, 3x the other way round; c5 has no 10x cram; a resized design ranks nothing.
    curves = {f"c{i}": seeds(5.0 + 0.1 * i, 4.5 - 0.1 * i, 4.0 + 0.1 * i, 3.5 + 0.1 * i) for i in range(6)}
    del curves["c5"][10.0]
    curves["x@sized"] = seeds(6.0, 2.0, 2.0, 2.0)
    configs, table = made_up(tmp_path, curves, {"x@sized": "resized"})
    fixed = [c.name for c in configs if c.kind != "resized"]
    text = "\n".join(analysis.correlation_table(table, fixed, MULTIPLES, resamples=200))
    rows = {m: re.search(rf"\| {m} \| 30x \| (\d+) \| (\S+) \((\S+) to (\S+)\) \| (\S+) \((\S+) to (\S+)\) \|", text)
            for m in ("1x", "3x", "10x")}
    assert {m: int(row.group(1)) for m, row in rows.items()} == {"1x": 6, "3x": 6, "10x": 5}
    for row in rows.values():
        spearman, kendall = (list(map(float, row.group(*g))) for g in ((2, 3, 4), (5, 6, 7)))
        for point, low, high in (spearman, kendall):
            assert low <= point <= high
    assert float(rows["1x"].group(2)) == 1.0 and float(rows["3x"].group(2)) == -1.0
    assert float(rows["3x"].group(7)) < 0  # reversed: the whole Kendall interval below zero
    # two configurations have no rank to correlate
    few = "\n".join(analysis.correlation_table(table, ["c0", "c1"], MULTIPLES, resamples=50))
    assert "| 1x | 30x | 2 | too few to rank | too few to rank |" in few


def test_the_study_candidates_are_also_ranked_alone(tmp_path):
    # The candidates keep their order from 1x to 30x; the hand designs' sizes turn the whole set round.
    curves = {f"c{i}": seeds(4.0 + 0.1 * i, 3.9 + 0.1 * i, 3.8 + 0.1 * i, 3.7 + 0.1 * i) for i in range(3)}
    curves |= {f"h{i}": seeds(6.0 + 0.1 * i, 4.0, 3.4, 3.0 - 0.2 * i) for i in range(3)}
    configs, table = made_up(tmp_path, curves, {f"h{i}": "hand design" for i in range(3)})
    text = transfer.report(configs, table, Budget.parse("2e12flops"), MULTIPLES, SEEDS_AT, {}, resamples=200)
    fixed = text[text.index("## Ranks against 30x over the 6 fixed configurations"):]
    alone = text[text.index("## Ranks against 30x over the 3 study candidates"):]
    assert re.search(r"\| 1x \| 30x \| 6 \| -0\.\d\d", fixed)  # across sizes: mostly reversed
    assert "| 1x | 30x | 3 | 1.00 " in alone and "| 10x | 30x | 3 | 1.00 " in alone
    # With only candidates, the one table is theirs already.
    configs, table = made_up(tmp_path, {name: curves[name] for name in ("c0", "c1", "c2")})
    text = transfer.report(configs, table, Budget.parse("2e12flops"), MULTIPLES, SEEDS_AT, {}, resamples=200)
    assert text.count("## Ranks against") == 1


def test_a_mean_below_the_count_model_is_marked_where_it_first_is(tmp_path):
    curves = {"deep": seeds(5.0, 4.0, 3.1, CONTEXT - 0.1), "shallow": seeds(5.1, 4.5, 4.0, 3.5)}
    configs, table = made_up(tmp_path, curves)
    text = "\n".join(analysis.configuration_table(configs, table, MULTIPLES))
    deep, shallow = table_row(text, "deep"), table_row(text, "shallow")
    assert deep.count(analysis.BELOW) == 1 and deep.endswith("| 30x | 9.0 |")  # 30x: one seed, 9 passes
    assert "2.900 (n=1) beyond-ngrams †" in deep and "3.100 ± " in deep and "neighbours |" in deep
    assert analysis.BELOW not in shallow and shallow.endswith("| none | 9.0 |")
    three = "\n".join(analysis.configuration_table(configs, table, MULTIPLES[:3]))  # 10x: seeds 0-2, 3 to 9
    assert table_row(three, "deep").endswith("| none | 6.0 |") and "| epochs at 10x |" in three
    assert text.index("| deep |") < text.index("| shallow |")  # the best at 30x first
    assert "5.000 ± 0.025 (n=3)" in deep  # seeds 4.99, 5.00, 5.01: the Student-t half-width


def test_the_best_at_1x_and_at_30x_are_named_and_compared(tmp_path):
    curves = {"fast": seeds(4.8, 4.3, 3.9, 3.70), "slow": seeds(5.2, 4.4, 3.6, 3.30),
              "middle": seeds(5.0, 4.4, 3.8, 3.50)}
    _, table = made_up(tmp_path, curves)
    line = analysis.best_lines(table, list(curves), MULTIPLES)[0]
    assert line.startswith("best at 1x: fast (4.800); best at 30x: slow (3.300): not the same; fast is 3 of 3 at 30x")
    assert "+0.400" in line and "outside noise" in line  # fast - slow at 30x, noise from 10x's seeds
    same = analysis.best_lines(table, ["fast", "middle"], MULTIPLES[:2])[0]  # 1x and 3x only: fast both times
    assert same.endswith("fast (4.300): the same configuration")


def test_a_resized_hand_design_lower_than_the_best_at_30x_is_named_beside_it(tmp_path):
    curves = {"fast": seeds(4.8, 4.3, 3.9, 3.70), "slow": seeds(5.2, 4.4, 3.6, 3.30),
              "sized-cpu@sized": seeds(5.1, 4.4, 3.65, 3.20), "other@sized": seeds(5.1, 4.4, 3.7, 3.60)}
    kinds = {"sized-cpu@sized": "resized", "other@sized": "resized"}
    _, table = made_up(tmp_path, curves, kinds)
    lines = analysis.best_lines(table, ["fast", "slow"], MULTIPLES, ["sized-cpu@sized", "other@sized"])
    assert lines[0].startswith("best at 1x: fast (4.800); best at 30x: slow (3.300)")  # the ranked ones alone
    assert lines[1].startswith("a resized hand design is lower at 30x: sized-cpu@sized (3.200); slow - sized-cpu@sized +0.100")
    behind = analysis.best_lines(table, ["fast", "slow"], MULTIPLES, ["other@sized"])  # 3.60: not lower
    assert behind == [behind[0], ""]


def test_the_ladder_pick_is_set_against_the_1x_winner_and_the_best_resized_hand_design(tmp_path):
    curves = {"trial 3": seeds(4.8, 4.3, 3.9, 3.70),  # the 1x winner
              "trial 7": seeds(5.0, 4.2, 3.7, 3.50),  # the ladder's pick
              "sized-cpu": seeds(5.1, 4.5, 3.75, 3.45), "sized-cpu@sized": seeds(5.1, 4.4, 3.9, 3.49)}
    curves["sized-cpu@sized"][10.0] = [3.7, 4.2, 3.4]  # a noisy difference at 10x
    kinds = {"sized-cpu": "hand design", "sized-cpu@sized": "resized"}
    configs, table = made_up(tmp_path, curves, kinds)
    fits = transfer.size_fits(configs, table, Budget.parse("2e12flops"), MULTIPLES)
    text = transfer.report(configs, table, Budget.parse("2e12flops"), MULTIPLES, SEEDS_AT, fits, pick="trial 7",
                           resamples=50)
    section = text.split("## The ladder's pick")[1]
    against_winner = next(line for line in section.splitlines() if "1x winner" in line)
    against_hand = next(line for line in section.splitlines() if "best resized hand design" in line)
    against_fixed = next(line for line in section.splitlines() if "best hand design" in line)
    assert "trial 3 (3.700 at 30x): pick - trial 3 -0.200 ± " in against_winner and "outside noise" in against_winner
    assert "noise: the seed spread of this difference at 10x, n=3" in against_winner
    # resized and as designed, each hand design read at 30x
    assert "sized-cpu@sized (3.490 at 30x): pick - sized-cpu@sized +0.010 ± " in against_hand
    assert "within noise" in against_hand
    assert "sized-cpu (3.450 at 30x): pick - sized-cpu +0.050 ± 0.000, outside noise" in against_fixed
    # the fixed configurations alone are ranked: 3 of them
    assert "over the 3 fixed configurations" in text and "| 1x | 30x | 3 |" in text


def test_a_common_seed_pair_is_an_interval_of_its_own_at_30x(tmp_path):
    curves = {"a": seeds(5.0, 4.5, 4.0, 3.5), "b": seeds(5.0, 4.5, 4.0, 3.5)}
    curves["a"][30.0], curves["b"][30.0] = [3.50, 3.52, 3.54], [3.40, 3.41, 3.43]
    _, table = made_up(tmp_path, curves)
    table = {name: {**row, 30.0: analysis.Cell(dict(enumerate(curves[name][30.0])), 5.8, CONTEXT, "1x32")}
             for name, row in table.items()}  # three seeds at 30x
    assert analysis.paired(table, "a", "b", MULTIPLES).endswith("outside noise (paired by seed, n=3)")


def test_hand_designs_are_resized_per_multiple_and_share_crams_where_the_size_is_their_own():
    from search.sizing import BudgetBest, SizeFit, non_embedding_params, size_family

    grid = ("1x16", "1x32", "1x64", "2x64", "2x128", "4x128")
    own = non_embedding_params(size_family(SIZED_CPU.arch, ["1x32"])[0])
    best = tuple(BudgetBest(flops, "1x32", own, "argmin") for flops in (2e12, 6e13))  # the budgets it was fitted on
    fit = SizeFit(exponent=0.5, coefficient=own / 2e12 ** 0.5, best=best, grid=grid)  # 1x32 at 2e12, more beyond
    hand = transfer.Configuration.fixed("sized-cpu", "hand design", ARCH, SIZED_CPU.train.to_dict(), MULTIPLES)
    (sized,), _ = transfer.resized_designs([hand], {"sized-cpu": SIZED_CPU}, fit, Budget.parse("2e12flops"), MULTIPLES)
    assert sized.name == "sized-cpu@sized" and sized.kind == "resized"
    assert sized.crammed_as[1.0] == "sized-cpu" and sized.archs[1.0] == ARCH  # its own size at 1x: its crams
    assert sized.crammed_as[30.0] == "sized-cpu@sized"
    sizes = [(sized.archs[m]["layers"], sized.archs[m]["hidden"]) for m in MULTIPLES]
    assert sizes == sorted(sizes, key=lambda s: s[0] * s[1]) and sizes[-1] != (1, 32)  # grows with compute
    keys = {(name, m, seed) for name, _, _, m, seed in transfer.wanted([hand, sized], SEEDS_AT)}
    assert ("sized-cpu", 1.0, 2) in keys and ("sized-cpu@sized", 1.0, 0) not in keys
    assert len([k for k in keys if k[1] == 30.0]) == 2  # one seed each at 30x


class InlinePool(concurrent.futures.ThreadPoolExecutor):
    """`Crams.run`'s process pool, in this process: the patched cram function is the one called."""

    def __init__(self, workers: int, mp_context=None):
        super().__init__(workers)


def test_a_second_call_crams_nothing_that_is_done(tmp_path, monkeypatch):
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", InlinePool)
    called = []

    def fake_cram(job: dict) -> dict:
        called.append(job["key"])
        name, multiple, seed = job["key"].split("|")
        return cram_row(name, float(multiple[:-1]), int(seed), 5.0 - 0.1 * float(multiple[:-1]) ** 0.5)

    configs = [transfer.Configuration.fixed(name, "candidate", ARCH, {}, MULTIPLES) for name in ("trial 1", "trial 2")]
    monkeypatch.setattr(cram_store, "cram_job", fake_cram)
    cram_store.Crams(tmp_path, "data", None, Budget.parse("2e12flops"), 1).run(transfer.wanted(configs, SEEDS_AT))
    assert len(called) == 2 * 10 and len((tmp_path / "crams.jsonl").read_text().splitlines()) == 20

    def fail(job: dict) -> dict:
        raise AssertionError(f"crammed {job['key']} again")

    monkeypatch.setattr(cram_store, "cram_job", fail)
    crams = cram_store.Crams(tmp_path, "data", None, Budget.parse("2e12flops"), 1)
    crams.run(transfer.wanted(configs, SEEDS_AT))  # everything done: nothing crammed
    table = analysis.cells(crams, configs, SEEDS_AT)
    assert {m: len(cell.by_seed) for m, cell in table["trial 1"].items()} == SEEDS_AT
    more = transfer.wanted(configs, {**SEEDS_AT, 30.0: 2})  # a second seed at 30x is new
    with pytest.raises(AssertionError, match=r"crammed trial \d\|30x\|1 again"):
        crams.run(more)
    configs[0].seeds = {30.0: 2}  # --seeds-at "trial 1:30x=2": a second seed there alone
    monkeypatch.setattr(cram_store, "cram_job", fake_cram)
    called.clear()
    crams.run(transfer.wanted(configs, SEEDS_AT))
    assert called == ["trial 1|30x|1"]
    table = analysis.cells(crams, configs, SEEDS_AT)
    assert (len(table["trial 1"][30.0].by_seed), len(table["trial 2"][30.0].by_seed)) == (2, 1)
    text = transfer.report(configs, table, Budget.parse("2e12flops"), MULTIPLES, SEEDS_AT, {}, resamples=20)
    assert text.startswith("# Transfer: 1x = 2e12flops; seeds at 1x: 3, 3x: 3, 10x: 3, 30x: 1; trial 1 at 30x: 2\n")


def study_storage(tmp_path: Path, losses: list[float]) -> str:
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=storage)
    study.set_user_attr("train", {})
    study.set_user_attr("budget", "2e12flops")
    for loss in losses:
        study.add_trial(optuna.trial.create_trial(value=loss, user_attrs={"arch": ARCH, "metrics": {"validation_loss": loss}}))
    return storage


def test_seeds_are_3_at_each_multiple_and_1_at_30x_unless_told():
    assert transfer.parse_seeds_at(None, MULTIPLES) == (SEEDS_AT, {})
    assert transfer.parse_seeds_at(None, (1.0, 3.0)) == ({1.0: 3, 3.0: 3}, {})
    assert transfer.parse_seeds_at("30x=2,1=4", MULTIPLES) == ({1.0: 4, 3.0: 3, 10.0: 3, 30.0: 2}, {})
    assert transfer.parse_seeds_at("30x=1, sized-cpu@sized:30x=2,a:b:10x=1", MULTIPLES) == (
        {1.0: 3, 3.0: 3, 10.0: 3, 30.0: 1}, {"sized-cpu@sized": {30.0: 2}, "a:b": {10.0: 1}})
    assert transfer.parse_multiples("1, 3x,10,30") == MULTIPLES


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    storage = study_storage(tmp_path, [5.0, 4.9, 5.1])
    flags = ["--data", str(tmp_path), "--study", "s", "--storage", storage, "--out", str(tmp_path / "out")]
    for extra, message in ((["--top", "6"], "--study s: 3 complete trials with a validation loss, fewer than --top 6"),
                           (["--top", "3", "--seeds-at", "5x=1"], "--seeds-at: '5x=1'"),
                           (["--top", "3", "--seeds-at", "nope:30x=2"], "--seeds-at: nope: no such configuration"),
                           (["--top", "3", "--multiples", "1,30,10"], "--multiples:"),
                           (["--top", "3", "--baselines", "nope-cpu"], "--baselines: nope-cpu"),
                           (["--top", "3", "--ladder-pick", "9"], "--ladder-pick 9: not a complete trial"),
                           (["--top", "3", "--size-fit", str(tmp_path / "none.json")], "cannot read a size fit")):
        assert transfer.main(flags + extra) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert transfer.main(["--data", str(tmp_path), "--study", "t", "--storage", storage]) == 2
    assert "--study t: no such study" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing made before the input is good


def test_the_candidates_are_the_top_trials_and_the_ladder_pick_beside_them(tmp_path):
    storage = study_storage(tmp_path, [5.0, 4.9, 5.1, 4.8])
    trials, train, budget = transfer.study_candidates(storage, "s", 2, pick=2)
    assert [number for number, _ in trials] == [3, 1, 2] and budget == "2e12flops" and train == {}


def test_a_cram_table_gives_its_best_architectures_by_mean_over_seeds_hand_designs_left_out(tmp_path):
    import csv

    from space.arch import FIELD_TYPES

    def row(key: str, source: str, seed: int, hidden: int, loss: str, error: str = "") -> dict:
        arch = {**ARCH, "hidden": hidden}
        return {"key": f"{key}|{seed}|2e12flops", "source": source, "seed": seed, "budget": "2e12flops",
                **{name: arch[name] for name in FIELD_TYPES}, "validation_loss": loss, "error": error}

    rows = [row("a", "hand:sized-cpu", 0, 32, "3.0"),                                   # best, but a hand design
            row("b", "design:1", 0, 64, "4.0"), row("b", "design:1", 1, 64, "5.0"),  # mean 4.5
            row("c", "design:2", 0, 96, "4.2"),
            row("d", "design:3", 0, 128, "", error="out of memory")]                 # no loss: not ranked
    path = tmp_path / "table.csv"
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    chosen, train, budget = transfer.table_candidates(str(path), 2)
    assert [(name, arch["hidden"]) for name, arch in chosen] == [("design:2", 96), ("design:1", 64)]
    assert budget == "2e12flops" and train["lr"] > 0  # the CPU profile's trial settings
    with pytest.raises(UsageError, match="--table .*: 2 architectures besides the hand designs, fewer than --top 3"):
        transfer.table_candidates(str(path), 3)
    with pytest.raises(UsageError, match="--table: .*none.csv does not exist"):
        transfer.table_candidates(str(tmp_path / "none.csv"), 1)


def test_report_only_writes_the_tables_from_the_crams_so_far_and_crams_nothing(tmp_path, monkeypatch):
    storage = study_storage(tmp_path, [5.0, 4.9])
    out = tmp_path / "out"
    out.mkdir()
    (out / "crams.jsonl").write_text(json.dumps(cram_row("trial 1", 1.0, 0, 4.9)) + "\n")
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", InlinePool)
    monkeypatch.setattr(cram_store, "cram_job", lambda job: pytest.fail(f"crammed {job['key']}"))
    assert transfer.main(["--data", str(tmp_path), "--study", "s", "--storage", storage, "--top", "2",
                          "--baselines", "sized-cpu", "--out", str(out), "--report-only"]) == 0
    text = (out / "transfer.md").read_text()
    assert table_row(text, "trial 1").split(" | ")[3].startswith("4.900 (n=1)")
    assert table_row(text, "sized-cpu").count(" - ") == 5  # nothing crammed at any multiple, no epochs at 30x


def write_config(path: Path, hidden: int, lr: float, ffn_kind: str = "geglu") -> str:
    arch = SIZED_CPU.arch.replace(hidden=hidden, ffn_kind=ffn_kind)
    run = SIZED_CPU.__class__(path.stem, arch, SIZED_CPU.train.__class__.from_dict({**SIZED_CPU.train.to_dict(), "lr": lr}))
    run.save(path)
    return str(path)


def test_run_configs_are_candidates_named_by_their_files_with_their_own_training(tmp_path, monkeypatch, capsys):
    """--configs: e.g. each study's export; its kept crams are read, another architecture's refused."""
    a, b = write_config(tmp_path / "winner-a.yaml", 64, 1e-3), write_config(tmp_path / "winner-b.yaml", 32, 2e-3, "gelu")
    chosen = transfer.config_candidates(f"{a}, {b}")
    assert [(name, arch["hidden"], train["lr"]) for name, arch, train in chosen] == [("winner-a", 64, 1e-3),
                                                                                     ("winner-b", 32, 2e-3)]
    with pytest.raises(UsageError, match="--configs: one or more YAML files with different names"):
        transfer.config_candidates(f"{a},{a}")

    out = tmp_path / "out"
    out.mkdir()
    kept = {**cram_row("winner-a", 1.0, 0, 4.9), "arch_fingerprint": load_run_config(a).arch.fingerprint()}
    (out / "crams.jsonl").write_text(json.dumps(kept) + "\n")
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", InlinePool)
    monkeypatch.setattr(cram_store, "cram_job", lambda job: pytest.fail(f"crammed {job['key']}"))
    flags = ["--data", str(tmp_path), "--configs", f"{a},{b}", "--baselines", "sized-cpu", "--out", str(out)]
    assert transfer.main(flags + ["--report-only"]) == 0
    text = (out / "transfer.md").read_text()
    assert table_row(text, "winner-a").split(" | ")[3].startswith("4.900 (n=1)")
    assert "| winner-b | candidate | 1x32" in text

    write_config(tmp_path / "winner-a.yaml", 128, 1e-3)  # the name now means another architecture
    capsys.readouterr()
    for report_only in (["--report-only"], []):  # refused before anything is crammed (cram_job fails the test)
        assert transfer.main(flags + report_only) == 2
        assert ("keeps winner-a|1x|0 of another architecture than this call's winner-a; pass another --out"
                in capsys.readouterr().err)


def test_configs_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    sized = write_config(tmp_path / "sized-cpu.yaml", 32, 1e-3)
    flags = ["--data", str(tmp_path), "--out", str(tmp_path / "out")]
    for extra, message in ((["--configs", str(tmp_path / "none.yaml")], "none.yaml: config file not found"),
                           (["--configs", sized], "--configs: sized-cpu is also a --baselines hand design")):
        assert transfer.main(flags + extra) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_replayed_ladder_promotes_the_best_third_and_picks_at_its_highest_rung(tmp_path):
    # a wins at 1x, b and c pass it at 3x; of b and c, c is better at 3x but b at 10x and 30x
    curves = {"a": seeds(4.0, 3.9, 3.8, 3.7), "b": seeds(4.1, 3.6, 3.3, 3.0), "c": seeds(4.2, 3.5, 3.4, 3.2),
              "d": seeds(4.3, 3.8, 3.6, 3.5), "e": seeds(4.4, 3.85, 3.7, 3.6), "f": seeds(4.5, 3.95, 3.75, 3.65)}
    _, table = made_up(tmp_path, curves)
    names = list(curves)
    budget = Budget.parse("2e12flops")  # the 1x budget the rungs are multiples of
    # 6 candidates at 3x, 2 (c, b) up to 10x, where b is better; 1 up to 30x: b
    assert analysis.replayed_ladder(table, names, (3.0, 10.0, 30.0), eta=3, budget=budget) == "b"
    # eta 6: only c, the best at 3x, goes up, and is the pick though b would have been better
    assert analysis.replayed_ladder(table, names, (3.0, 10.0, 30.0), eta=6, budget=budget) == "c"
    assert analysis.replayed_ladder(table, names, (1.0,), eta=3, budget=budget) == "a"
    del table["b"][30.0]  # the rung above is not crammed yet: the pick is the best at the highest reached
    assert analysis.replayed_ladder(table, names, (3.0, 10.0, 30.0), eta=3, budget=budget) == "b"
    assert analysis.replayed_ladder({n: {} for n in names}, names, (3.0,), eta=3, budget=budget) is None


def test_the_replayed_ladder_promotes_as_the_ladder_does(tmp_path, monkeypatch):
    """The replay calls search.analysis.ladder's promotion: a ladder that promoted every candidate
    would make the best at the last rung its pick, and so does the replay."""
    from search.analysis import ladder

    curves = {"a": seeds(4.0, 3.9, 3.8, 3.7), "b": seeds(4.1, 3.6, 3.3, 3.0), "c": seeds(4.2, 3.5, 3.4, 3.2)}
    _, table = made_up(tmp_path, curves)
    budget = Budget.parse("2e12flops")
    assert analysis.replayed_ladder(table, list(curves), (3.0, 10.0, 30.0), eta=3, budget=budget) == "c"  # c alone up
    monkeypatch.setattr(ladder, "promote", lambda standings, objective, eta: [s.candidate for s in standings])
    assert analysis.replayed_ladder(table, list(curves), (3.0, 10.0, 30.0), eta=3, budget=budget) == "b"


def test_the_replayed_ladder_pick_is_reported_against_the_1x_winner(tmp_path, monkeypatch):
    paths = [write_config(tmp_path / f"{name}.yaml", 32, 1e-3, ffn) for name, ffn in (("wa", "geglu"), ("wb", "gelu"))]
    out = tmp_path / "out"
    out.mkdir()
    rows = [cram_row(name, m, seed, loss) for name, curve in {"wa": seeds(4.0, 3.9, 3.8, 3.7),
                                                              "wb": seeds(4.1, 3.6, 3.3, 3.0)}.items()
            for m, losses in curve.items() for seed, loss in enumerate(losses)]
    (out / "crams.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", InlinePool)
    monkeypatch.setattr(cram_store, "cram_job", lambda job: pytest.fail(f"crammed {job['key']}"))
    assert transfer.main(["--data", str(tmp_path), "--configs", ",".join(paths), "--baselines", "",
                          "--out", str(out), "--ladder", "3,10,30", "--report-only"]) == 0
    text = (out / "transfer.md").read_text()
    assert "wb (the ladder's pick) at 30x: 3.000" in text
    assert "- against the 1x winner, wa (3.700 at 30x): pick - wa -0.700" in text
    assert "note: the ladder's pick: replayed over rungs 3x, 10x, 30x, eta 3" in text
    table = {"wa": {1.0: analysis.Cell({0: 3.0}, 5.8, CONTEXT, "1x32")}, "wb": analysis.cells(
        cram_store.Crams(out, "data", None, Budget.parse("2e12flops"), 1),
        [transfer.Configuration.fixed("wb", "candidate", ARCH, {}, MULTIPLES)], SEEDS_AT)["wb"]}
    lines = analysis.ladder_pick_lines(table, "wb", ["wa", "wb"], [], [], MULTIPLES)  # the 1x winner never got to 30x
    assert "- against the 1x winner, wa: no 30x cram" in lines
    # wb's design at another size is ranked, but is no candidate of the ladder: wa stays the pick
    wide = write_config(tmp_path / "wa-wide.yaml", 128, 1e-3)
    rows = [cram_row("wa-wide", m, seed, loss) for m, losses in seeds(4.0, 3.5, 3.0, 2.5).items()
            for seed, loss in enumerate(losses)]
    with (out / "crams.jsonl").open("a") as file:
        file.write("".join(json.dumps(row) + "\n" for row in rows))
    assert transfer.main(["--data", str(tmp_path), "--configs", ",".join([*paths, wide]), "--baselines", "",
                          "--out", str(out), "--ladder", "3,10,30", "--report-only"]) == 0
    text = (out / "transfer.md").read_text()
    assert "| wa-wide | other size | 1x128" in text and "wb (the ladder's pick) at 30x: 3.000" in text
    assert transfer.main(["--data", str(tmp_path), "--configs", ",".join(paths), "--baselines", "",
                          "--out", str(out), "--ladder", "3,20", "--report-only"]) == 2


def test_one_design_at_three_sizes_gets_a_size_fit_with_each_budget_held_out(tmp_path):
    from search.sizing import size_family

    sizes = ("1x32", "1x64", "2x64", "2x128")
    family = dict(zip(sizes, size_family(SIZED_CPU.arch, sizes)))
    # the best size grows with compute: 1x32 at 1x, 1x64 at 3x, 2x64 at 10x, 2x128 at 30x
    losses = {"1x32": (4.0, 3.80, 3.70, 3.65), "1x64": (4.1, 3.70, 3.50, 3.40),
              "2x64": (4.3, 3.75, 3.40, 3.20), "2x128": (4.6, 3.90, 3.45, 3.10)}
    rows = [cram_row(f"d-{size}", m, 0, loss) for size, curve in losses.items() for m, loss in zip(MULTIPLES, curve)]
    rows.append(cram_row("other", 1.0, 0, 3.9))
    (tmp_path / "crams.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    configs = [transfer.Configuration.fixed(f"d-{size}", "candidate", arch.to_dict(), {}, MULTIPLES)
               for size, arch in family.items()]
    configs.append(transfer.Configuration.fixed("other", "hand design", family["1x64"].replace(ffn_kind="gelu").to_dict(),
                                                {}, MULTIPLES))
    assert list(analysis.size_families(configs, MULTIPLES)) == ["d-1x32"]  # "other" is another design
    assert analysis.size_families(configs[:2] + configs[4:], MULTIPLES) == {}  # two sizes fit nothing

    crams = cram_store.Crams(tmp_path, "data", None, Budget.parse("2e12flops"), jobs=1)
    seeds_at = dict.fromkeys(MULTIPLES, 1)
    table = analysis.cells(crams, configs, seeds_at)
    fits = transfer.size_fits(configs, table, Budget.parse("2e12flops"), MULTIPLES)
    # a hand design resized by an earlier fit: where this fit sizes it otherwise, a note says so
    fit = fits["d-1x32"][1]
    as_fitted = {m: fit.choose(ArchConfig.from_dict(configs[-1].archs[m]), 2e12 * m).arch.to_dict() for m in MULTIPLES}
    earlier = {**as_fitted, 30.0: configs[-1].archs[30.0]}  # 30x at its own 1x64
    for archs, said in ((as_fitted, []), (earlier, ["30x 2x128, not 1x64"])):
        resized = transfer.Configuration("other@sized", "resized", {}, archs, dict.fromkeys(MULTIPLES, "other@sized"))
        notes = analysis.resized_otherwise([*configs, resized], fits, Budget.parse("2e12flops"), MULTIPLES)
        assert [note.split("(")[1].split(")")[0] for note in notes] == said
    assert notes[0].startswith("d-1x32's size fit written here would size other otherwise than --size-fit did")
    text = transfer.report(configs, table, Budget.parse("2e12flops"), MULTIPLES, seeds_at, fits, pick="d-1x32",
                           resamples=200)
    # the whole path: the ladder's pick, then its design at the size the fit chooses for 30x
    picked = text[text.index("## The ladder's pick"):text.index("## Size fit")]
    assert "d-1x32 (the ladder's pick) at 30x: 3.650 (n=1)" in picked
    assert "Its design at the size the fit below chooses for 30x:" in picked
    assert "d-2x128 (the ladder's pick at the fitted size) at 30x: 3.100 (n=1)" in picked
    assert "- against the 1x winner, d-1x32 (3.650 at 30x): pick - d-1x32 -0.550, noise not measured (one seed)" in picked
    assert analysis.fitted_pick({}, "d-1x32", Budget.parse("2e12flops"), MULTIPLES) is None  # no fit, no size
    section = text[text.index("## Size fit of d-1x32's design (1x32/1h geglu pre-norm rotary)"):]
    assert table_row(section, "1x32").split(" | ")[3] == "**4.000**"  # the lowest at 1x, in bold
    assert table_row(section, "2x128").split(" | ")[6] == "**3.100** |"
    best_n = [cell.strip(" |") for cell in table_row(section, "best N").split(" | ")[2:]]  # 1x, 3x, 10x, 30x
    assert "smallest size: a bound" in best_n[0] and "parabola" in best_n[1] and "largest size: a bound" in best_n[3]
    assert "note: at 6e13flops the best is the largest size crammed there, 2x128: the optimum may lie beyond it" in section
    fit_exponent = re.search(r"fit: N_opt = \S+ x C\^(\S+) \(exponent ± \S+; 4 budgets, 4 sizes\)", section)
    assert fit_exponent and float(fit_exponent.group(1)) > 0  # the best size grows with compute
    assert section.count("  held out ") == 4 and "RMS in ln N" in section
    # a multiple with one size crammed is left out of the fit: it has no best size
    lone = {**table, **{f"d-{size}": {m: cell for m, cell in table[f"d-{size}"].items() if m != 30.0}
                        for size in sizes[:3]}}
    _, partial, _ = transfer.family_fit(configs[:4], lone, Budget.parse("2e12flops"), MULTIPLES)
    assert partial.budgets == (2e12, 6e12, 2e13)
    # the fit as search.sizing writes it: search.export --target-budget reads it
    from search.sizing import load_size_fit

    assert analysis.write_size_fits(tmp_path, fits, MULTIPLES) == [
        f"d-1x32's size fit: {tmp_path / 'size-fit-d-1x32.json'}"]
    fit = load_size_fit(tmp_path / "size-fit-d-1x32.json")
    assert fit.exponent == pytest.approx(float(fit_exponent.group(1)), abs=1e-3) and len(fit.held_out) == 4
    assert fit.choose(SIZED_CPU.arch, 2e12 * 30).size == "2x128"  # the largest size at the largest budget
