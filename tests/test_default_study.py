"""benchmarks/default_study.py: the tables behind RESULTS' "The study a user runs", recomputed
from the stored crams alone, and the ASHA replay (search.study.asha.replay) they rest on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from search.study import asha

ROOT = Path(__file__).resolve().parents[1]


def test_asha_replayed_stops_what_is_worse_than_the_rung_quantile_so_far():
    # 4 reports; grace 1, reduction 2: rungs at reports 1 and 2. Trial 1 is worse than trial 0 at
    # report 1 (stopped there, a fifth of its budget); trial 2 is best at both and runs to the end.
    curves = [dict(enumerate(losses, start=1)) for losses in
              ([7.0, 6.5, 6.0, 5.5], [7.5, 7.0, 6.8, 6.5], [6.0, 5.0, 4.8, 4.5])]
    replay = asha.replay(curves, [1000.0] * 3, 1, 2)
    assert replay.stopped_at == [None, 1, None] and replay.kept == [0, 2]
    assert replay.budget_share == pytest.approx((1 + 1 / 5 + 1) / 3)
    # The best trial arrives first and the others trail it at the rung: ASHA keeps only it.
    best_first = asha.replay([curves[2], curves[0], curves[1]], [1000.0] * 3, 1, 2)
    assert best_first.kept == [0]


def test_asha_replayed_weighs_what_a_stopped_trial_spent_by_its_cost():
    curves = [{1: 6.0, 2: 5.0}, {1: 7.0, 2: 6.0}]  # 2 reports, rungs at 1 and 2: the second stops at 1
    replay = asha.replay(curves, [1.0, 3.0], 1, 2)
    assert replay.stopped_at == [None, 1] and replay.budget_share == pytest.approx((1 + 3 / 3) / 4)


def test_the_200_trial_table_reads_prefixes_as_far_as_the_study_ran(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import default_study

    def row(trial, state, loss="", first_draw=""):
        return {"trial": str(trial), "state": state, "validation_loss": loss, "first_draw": first_draw,
                "architecture": f"arch{trial}", "tokens": "1000", "flops_per_token": "1e6"}
    rows = [row(0, "complete", "5.0", "warm start sized-cpu"), row(1, "complete", "4.8"), row(2, "running")]
    text = default_study.long_table(rows, planned=200)
    assert "2 of its 200 trials have run so far" in text and "1 more were running when it was exported" in text
    assert "| 2 | 2 | 1 arch1 | 4.800 | 4.800 | 1 of 1 | 2e+09 |" in text
    # An export before any trial ended reads as such, not as an error.
    assert "| 0 | 0 | - | - | - | - | 0 |" in default_study.long_table([row(0, "running")])


def test_a_kept_study_restores_with_every_record_a_resume_reads(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import default_study
    import optuna

    source = f"sqlite:///{tmp_path / 'ran.db'}"
    study = optuna.create_study(study_name="long", storage=source)
    study.set_user_attr("controller", "gp")
    study.enqueue_trial({"x": 0.5}, user_attrs={"warm_start": "sized-cpu"})
    for number in range(3):
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
        trial.report(5.0 - number, step=1)
        trial.set_user_attr("curve", [[1, 5.0 - number]])
        if number < 2:
            study.tell(trial, trial.params["x"] if number == 0 else None,
                       state=optuna.trial.TrialState.COMPLETE if number == 0 else optuna.trial.TrialState.FAIL)
    # the third is left running, as a stopped driver leaves it
    kept = default_study.keep_study("long", source, crams=tmp_path)
    first = kept.read_bytes()
    assert default_study.keep_study("long", source, crams=tmp_path).read_bytes() == first  # same records, same file

    target = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    default_study.restore_study("long", target, crams=tmp_path)
    restored = optuna.load_study(study_name="long", storage=target)
    assert restored.user_attrs == {"controller": "gp"}

    def records(trials):
        return [(t.number, t.state, t.params, t.values, t.intermediate_values, t.user_attrs, t.distributions)
                for t in trials]
    assert records(restored.get_trials()) == records(study.get_trials())
    assert [t.state.name for t in restored.get_trials()] == ["COMPLETE", "FAIL", "RUNNING"]
    with pytest.raises(SystemExit, match="holds a study long already"):
        default_study.restore_study("long", target, crams=tmp_path)
    with pytest.raises(SystemExit, match="^restore --storage: cannot open sqlite:////proc/none/optuna.db"):
        default_study.restore_study("long", "sqlite:////proc/none/optuna.db", crams=tmp_path)
    with pytest.raises(SystemExit, match="no .*other.optuna.jsonl.gz"):
        default_study.restore_study("other", target, crams=tmp_path)
    # A copy under another name is a study of its own, with the same records.
    default_study.restore_study("long", target, crams=tmp_path, to_name="again")
    assert records(optuna.load_study(study_name="again", storage=target).get_trials()) == records(study.get_trials())


def test_stored_crams_are_added_to_not_overwritten_and_the_ladder_reads_every_budget(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import json

    import default_study

    monkeypatch.setattr(default_study, "CRAMS", tmp_path / "crams")

    def cram(name, budget, seed, loss):
        run = tmp_path / name
        run.mkdir()
        (run / "result.json").write_text(json.dumps({"budget": budget, "seed": seed, "validation_loss": loss,
                                                     "tokens": 1000, "flops_per_token": 2e9, "seconds": 1.0}))
        return str(run)

    default_study.export_crams("sized-cpu-ladder", "sized-cpu", [cram("a", "4e12flops", 1001, 4.5)])
    # A later session's crams, one of them the same cram again (spelled otherwise): added, that one replaced.
    default_study.export_crams("sized-cpu-ladder", "sized-cpu", [cram("b", "1.6e13flops", 1001, 4.0),
                                                                 cram("c", "4000000000000flops", 1001, 4.4)])
    rows = default_study.read(tmp_path / "crams" / "sized-cpu-ladder.csv")
    assert [(row["budget"], row["validation_loss"]) for row in rows] == [("4000000000000flops", "4.4"),
                                                                          ("1.6e13flops", "4.0")]
    # The ladder is every budget stored, as a multiple of the trial budget.
    ladder = default_study.compute_ladder({1001: 5.0}, rows)
    assert ladder == {1.0: 5.0, 2.0: 4.4, 8.0: 4.0}


@pytest.mark.slow  # imports search.run (torch) and bootstraps every report
def test_the_results_tables_come_from_the_stored_crams_alone(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "default_study.py"), "report"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    for heading in ("### Each study", "### Winners confirmed", "### Rungs", "### ASHA replayed with other rungs"):
        assert heading in out.stdout
    assert "| default-s0 |" in out.stdout
    # The compute-equivalent multiple, interpolated in log-compute on sized-cpu's ladder (1x-8x, every
    # budget stored), and the payback it implies.
    assert "| 4.0x | 34.0 | 11.3 |" in out.stdout and "| 2.5x | 35.0 | 23.3 |" in out.stdout
    # Each winner paired with the sized-cpu crams of its own confirmation (seed 1's differ in the
    # fourth decimal from the other studies').
    assert "| default-s1 | trial 28 | 4.248 ± 0.087 | 4.955 ± 0.126 | -0.707 ± 0.142, outside noise |" in out.stdout
    assert "| 6.7x | 200.0 | 35.1 |" in out.stdout and "1.6e13flops: 4.148 ± 0.098, 3.2e13flops: 4.114 ± 0.014." in out.stdout
    # The other hand designs on the same fresh seeds, strongest first.
    assert "### The hand designs on the same seeds" in out.stdout
    assert "| modernbert-cpu | 5.299 ± 0.183 | +0.344 ± 0.073, outside noise |" in out.stdout
    # The lead run for real: its FLOPs against its trials each run to the end, and its confirmation
    # paired with the sized-cpu crams its own confirmation made.
    assert "| lead-tpe-early | 16 of 62 | 46 (2: 17, 4: 19, 8: 10) |" in out.stdout and "| 5.58e+13 | 45% |" in out.stdout
    assert "| lead-tpe-early | trial 60 | 4.262 ± 0.035 | 4.955 ± 0.126 | -0.693 ± 0.135, outside noise | 3.8x |" in out.stdout
    # The studies run with --early-stop: the FLOPs of their stopped trials counted as far as they ran.
    assert "### With --early-stop" in out.stdout and "| early-s0 | 9 of 32 | 23 (2: 10, 4: 8, 8: 5) |" in out.stdout
    # The screened studies (--screen 4): the screen and the promotion's FLOPs together, against the same
    # trials crammed whole and against the unscreened study of the same seed; the search's compute
    # in the payback counts the screen too.
    assert "### Screened: --screen 4" in out.stdout
    assert "| bracket-s0 | 31 | 5.571 | 8 | 0 1x32/4h swiglu sandwich-norm rotary untied | 4.315 | 1 of 31 |" in out.stdout
    assert "| 3.15e+13 | 51% | 51% (default-s0) |" in out.stdout
    assert "| bracket-s1 | trial 3 | 4.328 ± 0.067 | 4.955 ± 0.126 | -0.627 ± 0.169, outside noise | 3.0x | 19.0 | 9.5 |" \
        in out.stdout
    # The 200-trial command screened: its winner between sized-cpu's 8x and 16x.
    assert "| bracket-200 | 193 | 4.794 | 50 |" in out.stdout and "| 1.96e+14 | 51% | 50% (default-200) |" in out.stdout
    assert "| bracket-200 | trial 0 | 4.134 ± 0.073 | 4.955 ± 0.126 | -0.821 ± 0.169, outside noise | 10.6x | 101.2 " \
           "| 10.5 |" in out.stdout
    # The CPU profile's default since, --promote 8: the same studies' promotions of their screen's
    # best eighth, each winner among them, so confirmed by the same crams, for less compute.
    eighth = out.stdout[out.stdout.index("### Screened: --screen 4 --promote 8"):]
    assert "| bracket-s1 | 32 | 5.342 | 4 | 3 1x32/4h silu pre-norm rotary untied | 4.327 | 4 of 32 |" in eighth
    assert "| bracket-s1 | trial 3 | 4.328 ± 0.067 | 4.955 ± 0.126 | -0.627 ± 0.169, outside noise | 3.0x | 15.0 | 7.5 |" \
        in eighth
    assert "| pays back within 10 final runs | met: 8.2 | met: 7.5 | not met: 12.5 | met: 7.9 |" in eighth
    assert "| bracket-200 | trial 0 | 4.134 ± 0.073 | 4.955 ± 0.126 | -0.821 ± 0.169, outside noise | 10.6x | 76.2 " \
           "| 7.9 |" in eighth
    # ... and those promotions run again with --promote 8 from copies of the screens: the same crams.
    assert "| eighth-s1 | bracket-s1-screen | 4 | yes | 0.0e+00 | 3 1x32/4h silu pre-norm rotary untied | 4.3272 |" \
        in eighth
    assert "| at most 60% of the FLOPs of every trial run to its end | met: 38% | met: 38% | met: 38% | met: 38% |" in eighth
    # A seed no earlier study ran, with today's defaults: its screen and promotion together, its target.
    fresh = out.stdout[out.stdout.index("### A seed no earlier study ran"):]
    assert "| fresh-s3 | 32 | 5.437 | 4 | 0 1x32/1h gelu sandwich-norm rotary untied | 4.374 | 1 of 32 |" in fresh
    assert "| fresh-s3 | trial 0 | 4.437 ± 0.029 | 4.955 ± 0.126 | -0.518 ± 0.136, outside noise | 2.0x | 15.0 | 15.0 |" \
        in fresh and "| pays back within 10 final runs | not met: 15.0 |" in fresh
    # The 200-trial study, read at 32, 64, ... trials as far as it has run (trials cut short left out).
    assert "### The 200-trial study (default-200)" in out.stdout
    assert "| 32 | 31 | 29 1x32/2h silu sandwich-norm rotary | 4.172 |" in out.stdout
    # RESULTS shows these very tables: every row the report prints is there as printed.
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    missing = [line for line in out.stdout.splitlines() if line.startswith("|") and line not in results]
    assert not missing, f"RESULTS.md lacks {len(missing)} rows of the report, e.g. {missing[0]}"


def test_a_share_that_drops_the_confirmed_winner_is_not_read_as_confirmed(monkeypatch):
    """Seed 1's winner was 4th of its screen: promoting a sixteenth (2 of 32) drops it, and the
    confirmation of it must not be read as the smaller study's."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import default_study

    rows, screen = (default_study.read(default_study.CRAMS / f"bracket-s1{suffix}.csv") for suffix in ("", "-screen"))
    kept = default_study.best_share(rows, screen, 16)
    assert len(kept) == 2 and "3" not in {row["trial"] for row in kept}
    assert len(default_study.best_share(rows, screen, 8)) == 4  # the eighth keeps it
    study = {"bracket-s1": kept + screen}
    assert "| bracket-s1 | trial 0, not confirmed (the confirmation crammed trial 3) |" in \
        default_study.confirmation_table(study)
    target = default_study.target_table(study)
    assert "| pays back within 10 final runs | not confirmed |" in target and "met: 31%" in target
