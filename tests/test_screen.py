"""`search.run --screen N`: a study screened at 1/N of its budget, the best 1/N promoted to the whole
budget (search/study/screen.py): what is promoted, what it keeps of the screen, the flags refused,
and a real (tiny) screened study with its resume."""

from __future__ import annotations

import random

import optuna
import pytest
from optuna.trial import TrialState

from search.base import attrs
from search.base.paths import PROFILES
from search.run import main
from search.study import controllers
from search.study.screen import promote, promoted_count, ranked_screen, screen_budget, spent_line
from search.study.warm_start import describe_first_draw
from space import default_space_path, load_space
from space.errors import UsageError
from tests.helpers import requires_shared_data
from tests.studies import check_stores_agree, study_args
from trainer.budget import Budget

SPACE = load_space(default_space_path("cpu"))


def test_a_screen_trial_gets_a_share_of_the_budget_and_the_best_share_goes_on():
    assert screen_budget(Budget.parse("2e12flops"), 4).text == "5e11flops"
    assert screen_budget(Budget.parse("2e4tokens"), 3).amount == pytest.approx(2e4 / 3, rel=1e-5)
    assert [promoted_count(trials, 4) for trials in (1, 4, 5, 32, 200)] == [1, 1, 2, 8, 50]
    assert [promoted_count(trials, 8) for trials in (1, 9, 32, 200)] == [1, 2, 4, 25]


def screen_study(values: list[float], repeat: int | None = None) -> optuna.Study:
    """A screen in memory: a warm start (sized-cpu), then random draws, told `values` in order; the
    trial `repeat` is drawn again as the study's last trial, a repeat told the original's value."""
    rng = random.Random(0)
    warm = [("sized-cpu", SPACE.sample_random(rng))]
    study = controllers.open_study("s-screen", None, "random", "mlm", SPACE, seed=0, warm_starts=warm)
    for value in values:
        proposal = controllers.ask(study, SPACE)
        controllers.tell(study, proposal.number, [value],
                         metrics={"tokens": 1000.0, "flops_per_token": 2.5e5, "validation_loss": value})
    if repeat is not None:
        original = study.trials[repeat]
        study.enqueue_trial(dict(original.params))
        proposal = controllers.ask(study, SPACE)
        assert proposal.repeat_of == repeat
        controllers.tell(study, proposal.number, original.values, state="repeat")
    return study


def test_the_screens_best_distinct_architectures_are_promoted_best_first_with_their_marks():
    screen = screen_study([5.9, 6.3, 5.7, 6.1, 5.8], repeat=2)
    assert [t.number for t in ranked_screen(screen)] == [2, 4, 0, 3, 1]  # the repeat (trial 5) is not a candidate
    study = controllers.open_study("s", None, "random", "mlm", SPACE, seed=0)
    assert promote(study, screen, SPACE, 3) == [2, 4, 0]
    waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert [t.user_attrs[attrs.PROMOTED_FROM] for t in waiting] == [2, 4, 0]
    # The warm start stays one: a study whose best is it still says that its search found nothing better.
    assert waiting[2].user_attrs[attrs.WARM_START] == "sized-cpu" and attrs.WARM_START not in waiting[0].user_attrs
    for promoted in waiting:
        proposal = controllers.ask(study, SPACE)  # the queued architecture, exactly
        assert proposal.config.to_dict() == screen.trials[promoted.user_attrs[attrs.PROMOTED_FROM]].user_attrs[attrs.ARCH]
        controllers.tell(study, proposal.number, [5.0], metrics={"tokens": 4000.0, "flops_per_token": 2.5e5})
    # A promoted study has no first draw of its own: that was the screen's.
    assert describe_first_draw(study) is None and describe_first_draw(screen).startswith("first draw: 1 warm start")
    # A resume to more trials promotes the next best, none twice.
    assert promote(study, screen, SPACE, 4) == [3] and promote(study, screen, SPACE, 4) == []
    line = spent_line(screen, study, 4)
    # screen: 5 crams of 2.5e8 FLOPs (the repeat trained nothing); promotion: 3 of 1e9; whole: 5 x 4 x 2.5e8
    assert "screened study: 4.25e+09 FLOPs, the screen 1.25e+09 (6 trials) and the promotion 3e+09" in line
    assert "85% of the 5e+09 its trials would spend whole; promoted 4 trials, 1 of the first draw (warm start sized-cpu)" in line


def test_a_screened_study_refuses_early_stopping_in_one_line(capsys):
    assert main(["--screen", "4", "--early-stop", "--trials", "8", "--estimate"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--early-stop" in err and "--screen 4" in err
    assert main(["--screen", "0", "--trials", "8", "--estimate"]) == 2
    assert "--screen: must be at least 1" in capsys.readouterr().err
    assert main(["--promote", "0", "--screen", "4", "--trials", "32", "--estimate"]) == 2
    assert "--promote: must be at least 1" in capsys.readouterr().err
    # The short look is not screened, so it has nothing to promote.
    assert main(["--promote", "4", "--trials", "8", "--profile", "cpu", "--no-probe", "--estimate"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: --promote: only a screened study promotes")


def test_the_cpu_profile_screens_a_search_but_not_a_short_look(capsys):
    """The README's commands as they stand: 8 trials (the first draw) unscreened, 32 screened at a
    quarter; --early-stop asks for ASHA's unscreened study; --screen 1 turns the screen off."""
    def stages(*flags: str) -> list[str]:
        assert main(["--budget", "2e12flops", "--no-probe", "--profile", "cpu", "--estimate", *flags]) == 0
        return [line for line in capsys.readouterr().out.splitlines() if line.startswith("estimate: ")]

    # The promotion: the best eighth, the profile's screen.promote; --promote 4 a quarter.
    assert stages("--trials", "32") == [stages("--trials", "32", "--screen", "4")[0], stages("--trials", "4")[0]]
    assert stages("--trials", "32", "--promote", "4")[1] == stages("--trials", "8")[0]
    assert "25 trials" in stages("--trials", "200")[1]
    assert len(stages("--trials", "19")) == 1 and len(stages("--trials", "20")) == 2
    assert stages("--trials", "32", "--screen", "1") == stages("--trials", "32", "--no-early-stop", "--screen", "1")
    assert len(stages("--trials", "32", "--early-stop")) == 1


def test_a_resume_reads_the_screen_its_study_was_started_with(tmp_path):
    """Without --screen and --promote, a resume takes its study's stored screen, not the profile's: an
    unscreened study stays one when resumed to 32 trials, a screen's recorded factor and share are
    kept, and a screen recorded before the share was promoted the best 1/factor, as it did then."""
    from search.run import check_inputs, parse_args

    storage = f"sqlite:///{tmp_path}/optuna.db"
    controllers.open_study("plain", storage, "random", "mlm", SPACE, seed=0)
    controllers.open_study("thirds-screen", storage, "random", "mlm", SPACE, seed=0).set_user_attr(attrs.SCREEN, 3)
    halves = controllers.open_study("halves-screen", storage, "random", "mlm", SPACE, seed=0)
    halves.set_user_attr(attrs.SCREEN, 2)
    halves.set_user_attr(attrs.PROMOTE, 5)

    def screen(study: str, *flags: str) -> tuple[int, int]:
        checked = check_inputs(parse_args(["--profile", "cpu", "--budget", "2e12flops", "--no-probe", "--trials", "32",
                                           "--study", study, "--resume", "--storage", storage, *flags]))
        return checked.screen, checked.promote

    assert [screen(study) for study in ("plain", "thirds", "halves", "new")] == [(1, 1), (3, 3), (2, 5), (4, 8)]
    assert screen("thirds", "--screen", "3") == (3, 3) and screen("thirds", "--promote", "6") == (3, 6)
    assert screen("thirds", "--screen", "4") == (4, 8)  # another screen than it was started with: the profile's share


@pytest.mark.parametrize("setting", ["4", "{factor: 0}", "{factor: 4, min_trials: twenty}", "{factor: 4, promote: 0}"])
def test_a_profiles_bad_screen_is_one_line_naming_the_field(tmp_path, setting):
    from search.run import load_profile

    cpu = (PROFILES / "cpu.yaml").read_text()
    path = tmp_path / "mine.yaml"
    assert "screen: {factor: 4, promote: 8, min_trials: 20}" in cpu
    path.write_text(cpu.replace("screen: {factor: 4, promote: 8, min_trials: 20}", f"screen: {setting}"))
    with pytest.raises(UsageError, match=r"^--profile: mine.yaml: screen") as error:
        load_profile(path)
    assert "\n" not in str(error.value)


def test_a_screened_estimate_prices_both_stages(capsys):
    assert main(["--screen", "4", "--trials", "32", "--budget", "2e12flops", "--no-probe", "--profile", "cpu",
                 "--estimate"]) == 0
    out = capsys.readouterr().out
    screen, promotion = out.split("promotion, study ")
    assert "screen, study " in screen and "-screen:" in screen and "32 trials" in screen and "5e11flops" in screen
    assert "4 trials" in promotion and "2e12flops" in promotion


@requires_shared_data
@pytest.mark.slow
def test_a_screened_study_runs_its_screen_whole_then_promotes_and_resumes(wiki_slice_dir, slice_cache, tmp_path, capsys):
    """The tiny profile turns ASHA on: a screen stops no trial. Its best third go on to the whole
    budget as a study of their own; a resume to more trials screens more and promotes the next best.
    (On the local executor: the stages are two ordinary studies, run by either executor alike.)"""
    args = lambda *extra: study_args(tmp_path, wiki_slice_dir, "scr", "--controller", "random", "--objective", "mlm",
                                     "--no-probe", "--executor", "local", *extra, cache_dir=slice_cache)
    assert main(args("--trials", "5", "--screen", "3")) == 0
    out = capsys.readouterr().out
    assert "screened study (--screen 3 --promote 3; --screen 1 crams every trial whole): 5 trials at 6666.67tokens in study " \
           "scr-screen, then the best 2 at 2e4tokens in study scr" in out
    screen, _ = check_stores_agree(tmp_path, "scr-screen", 5)
    study, runs = check_stores_agree(tmp_path, "scr", 2)
    assert all(t.state == TrialState.COMPLETE for t in screen.trials)  # no early stopping in a screen
    assert {r["params.budget"] for r in runs} == {"2e4tokens"}
    assert screen.user_attrs[attrs.BUDGET] == "6666.67tokens" and study.user_attrs[attrs.BUDGET] == "2e4tokens"
    best = [t.number for t in ranked_screen(screen)]
    assert [t.user_attrs[attrs.PROMOTED_FROM] for t in study.trials] == best[:2]
    # MLflow names each promoted run's screen trial.
    assert sorted(int(r["tags.cramnas.promoted_from"]) for r in runs) == sorted(best[:2])
    for trial in study.trials:  # the screen's architecture, crammed whole
        assert trial.user_attrs[attrs.ARCH] == screen.trials[trial.user_attrs[attrs.PROMOTED_FROM]].user_attrs[attrs.ARCH]
        assert trial.user_attrs[attrs.METRICS]["tokens"] > 2 * screen.trials[0].user_attrs[attrs.METRICS]["tokens"]
    assert f"promoted to 2e4tokens: the screen's trials {best[0]}, {best[1]}, best first (study scr-screen)" in out
    assert "screened study: " in out and "python -m search.confirm --study scr " in out

    # Resumed without --screen: the screen's recorded factor and share, not the tiny profile's (none).
    assert (screen.user_attrs[attrs.SCREEN], screen.user_attrs[attrs.PROMOTE]) == (3, 3)
    assert main(args("--trials", "7", "--resume")) == 0
    screen, _ = check_stores_agree(tmp_path, "scr-screen", 7)
    study, _ = check_stores_agree(tmp_path, "scr", 3)
    promoted = [t.user_attrs[attrs.PROMOTED_FROM] for t in study.trials]
    assert promoted[:2] == best[:2] and len(set(promoted)) == 3

    # Resumed after its screen, before its promotion began (the driver died between the two): the
    # promotion's study is created then, with what export reads of it.
    screen_only = study_args(tmp_path, wiki_slice_dir, "late-screen", "--controller", "random", "--objective", "mlm",
                             "--no-probe", "--executor", "local", "--budget", "6666.67tokens", "--trials", "3",
                             cache_dir=slice_cache)
    assert main(screen_only) == 0
    late = study_args(tmp_path, wiki_slice_dir, "late", "--controller", "random", "--objective", "mlm", "--no-probe",
                      "--screen", "3", "--executor", "local", "--trials", "3", "--resume", cache_dir=slice_cache)
    assert main(late) == 0
    study, _ = check_stores_agree(tmp_path, "late", 1)
    assert study.user_attrs[attrs.BUDGET] == "2e4tokens" and attrs.TRAIN in study.user_attrs
