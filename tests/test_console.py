"""The console and the logs as a user sees them (trainer/console.py): a usage mistake is one line
with a suggestion, Ctrl-C is one line and exit 130, progress in a log file is plain lines (no
carriage returns), a study redirected to a file prints one line per finished trial, and a study
too small for ASHA's rungs runs every trial to the end."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from search.base.objectives import OBJECTIVES
from search.study.controllers import CONTROLLERS
from search.study.driver import early_stop_for_session
from tests.helpers import ROOT, SHARED_DATA, FakeTime, cli_env, requires_shared_data, slice_config, tiny_checkpoint
from tests.studies import study_args
from trainer.console import ProgressLines, choice_error, count, eta, floor_gap, one_line_on_ctrl_c

# Lines third-party libraries print unless told not to (issue 21 §1): none may reach a user's log.
LIBRARY_NOISE = ("Creating initial MLflow database tables", "A new study created", "Wrote the latest version",
                 "Started a local Ray instance", "Generating train split")


def run_cli(module: str, *args: str, cwd: Path) -> tuple[int, str, str]:
    """`python -m module args` as a user runs it with its output redirected to files (not a terminal)."""
    out, err = cwd / "stdout.txt", cwd / "stderr.txt"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        code = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=cli_env(), stdout=stdout,
                              stderr=stderr, timeout=600).returncode
    return code, out.read_text(), err.read_text()


def usage_error(main, argv: list[str], capsys) -> str:
    """The error a CLI's parser gives for `argv`, asserting exit 2 and a single line."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err  # no usage block
    return captured.err.strip()


def test_a_mistyped_choice_is_one_line_that_names_the_choices_and_the_likely_one(capsys):
    from search.run import main

    line = usage_error(main, ["--controller", "tpee"], capsys)
    assert line == f"error: --controller: 'tpee' is not one of {', '.join(sorted(CONTROLLERS))}; did you mean tpe?"
    line = usage_error(main, ["--objective", "prob"], capsys)
    assert line.startswith("error: --objective: 'prob' is not one of ") and line.endswith("did you mean probe?")
    assert all(name in line for name in OBJECTIVES)


@pytest.mark.parametrize("module, argv, expected", [
    ("search.export", ["--study", "s", "--rank-by", "mlmm"], "error: --rank-by: 'mlmm' is not one of"),
    ("glue.evaluate", ["--checkpoint", "c", "--protocol", "sain"], "did you mean sane?"),
    ("trainer.cram", ["--config", "c.yaml", "--bugdet", "60s"], "did you mean --budget?"),
    ("search.confirm", ["--study"], "error: --study: expected one argument"),
    ("dashboards.report", [], "error: the following arguments are required: --study"),
])
def test_every_cli_gives_usage_errors_in_one_line(module, argv, expected, capsys):
    main = __import__(module, fromlist=["main"]).main
    assert expected in usage_error(main, argv, capsys)


def test_a_choice_with_nothing_close_gets_no_guess():
    assert choice_error("xyz", ["sane", "probe"]) == "'xyz' is not one of sane, probe"


@pytest.mark.slow
def test_the_typo_error_reaches_a_user_as_one_line(tmp_path):
    code, out, err = run_cli("search.run", "--controller", "tpee", "--trials", "3", cwd=tmp_path)
    assert code == 2 and out == ""
    assert err.splitlines() == [f"error: --controller: 'tpee' is not one of {', '.join(sorted(CONTROLLERS))}; "
                                "did you mean tpe?"]


def test_ctrl_c_is_one_line_and_exit_130(capsys):
    @one_line_on_ctrl_c
    def main(argv=None) -> int:
        raise KeyboardInterrupt

    assert main([]) == 130
    assert capsys.readouterr().err == "interrupted (Ctrl-C)\n"


def test_ctrl_c_in_a_cli_gives_no_traceback(monkeypatch, capsys):
    import search.export

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(search.export, "export", interrupted)
    assert search.export.main(["--study", "s"]) == 130
    assert capsys.readouterr().err == "interrupted (Ctrl-C)\n"


def test_progress_lines_come_every_tenth_and_after_a_quiet_half_minute():
    clock, lines = FakeTime(), []
    progress = ProgressLines(lines.append, clock=clock.clock)
    for percent in range(1, 101):
        clock.advance(1.0)
        progress.update(percent / 100, f"step {percent}")
    assert [int(line.split("%")[0]) for line in lines] == list(range(10, 101, 10))
    assert lines[0] == " 10%  10 s elapsed, ETA 1.5 min  step 10"
    clock.advance(31.0)  # no new tenth, but half a minute without a line: say it is still going
    progress.update(1.0)
    assert len(lines) == 11


def test_words_agree_with_their_numbers():
    assert floor_gap(0.481) == "0.481 nats below" and floor_gap(-0.05) == "0.050 nats above"
    assert floor_gap(0.5, unit="") == "0.500 below"
    assert (count(1, "complete trial"), count(3, "complete trial")) == ("1 complete trial", "3 complete trials")
    assert eta(60.0, 1, 4) == "ETA 3.0 min" and eta(0.0, 0, 4) == "ETA ?"


def test_a_study_too_small_for_asha_runs_every_trial_and_says_so():
    asha = {"grace_reports": 4, "reduction_factor": 2, "min_trials": 20}
    assert early_stop_for_session(asha, 8) == (None, "early stopping off: 8 trials are too few to stop any (ASHA from 20)")
    assert early_stop_for_session(asha, 1)[1].startswith("early stopping off: 1 trial is too few")
    assert early_stop_for_session(asha, 20) == (asha, None)
    assert early_stop_for_session(None, 3) == (None, None)  # --no-early-stop: nothing to say


def test_a_trial_line_says_what_a_log_reader_needs(capsys):
    from search.study.controllers import Proposal
    from search.study.searcher import TrialOutcome
    from search.study.view import StudyView
    from space.arch import ArchConfig

    plan = SimpleNamespace(study="s", objective=OBJECTIVES["mlm"], trials=8, unigram_floor=6.4)
    view = StudyView(plan, study=None, tracker=None, already_done=2, remaining=6)
    arch = ArchConfig(layers=2, hidden=64, heads=4)
    view.record(TrialOutcome(2, "complete", {"validation_loss": 5.9, "nats_below_floor": 0.01,
                                             "corruption_floor": 5.91, "context_reference": 3.2},
                             Proposal(2, arch, "f"), "run"))
    view.record(TrialOutcome(3, "failed", {}, Proposal(3, arch, "f"), "run", reason="OutOfMemory: too big"))
    complete, failed = capsys.readouterr().out.splitlines()
    assert complete.startswith(f"trial 2 complete: {arch.describe()}; validation_loss 5.9000, 0.010 nats below the "
                               "corruption floor; regime plateau [3/8 done, ETA ")
    assert failed.startswith(f"trial 3 failed: {arch.describe()}; OutOfMemory: too big [4/8 done, ETA ")


@pytest.mark.slow
def test_a_redirected_study_prints_one_plain_line_per_trial(wiki_slice_dir, slice_cache, tmp_path):
    code, out, err = run_cli("search.run", *study_args(tmp_path, wiki_slice_dir, "logged", "--trials", "3",
                                                       "--objective", "mlm", "--no-probe", cache_dir=slice_cache),
                             cwd=tmp_path)
    assert code == 0, err
    assert "\r" not in out and "\r" not in err
    trial_lines = [line for line in out.splitlines() if line.startswith("trial ")]
    assert len(trial_lines) == 3
    for line in trial_lines:  # number, state, architecture, loss and the study's progress
        first_draw = r"( \((warm start \S+|cover)\))?"  # a trial of the study's first draw says so
        assert re.fullmatch(rf"trial \d+{first_draw} (complete|repeat|pruned|failed): \d+x\d+/\d+h .+ \[\d/3 done, ETA .+\]",
                            line), line
    assert sorted(int(line.split()[1]) for line in trial_lines) == [0, 1, 2]
    assert "[3/3 done" in out and "validation_loss" in out
    noise = [line for line in (out + err).splitlines() if any(text in line for text in LIBRARY_NOISE)]
    assert noise == []


@pytest.mark.slow
def test_a_redirected_cram_logs_plain_progress_lines(wiki_slice_dir, slice_cache, tmp_path):
    code, out, err = run_cli("trainer.cram", "--config", str(slice_config(tmp_path)), "--budget", "6e3tokens",
                             "--data", str(wiki_slice_dir), "--cache-dir", str(slice_cache), "--out",
                             str(tmp_path / "run"), cwd=tmp_path)
    assert code == 0, err
    assert "\r" not in out and "\r" not in err
    progress = [line for line in err.splitlines() if re.match(r" *\d+%  ", line)]
    # The last progress report comes before the end of the budget (trainer.loop); the end has its own line.
    assert progress and int(progress[-2].split("%")[0]) >= 70 and "loss" in progress[-2]
    assert progress[-1].startswith("100%") and "tokens" in progress[-1]
    assert len(progress) <= 10 + 2  # a line per tenth (and one for a quiet half minute), not one per report
    assert re.search(r"regime (plateau|neighbours|beyond-ngrams): [\d.]+ nats (below|above) the corruption floor", out)


@requires_shared_data
@pytest.mark.slow
def test_glue_evaluate_says_each_run_and_the_time_left(tmp_path, capsys):
    from glue.evaluate import main

    for split, rows in (("train", 32), ("validation", 16)):
        (tmp_path / "glue" / "rte").mkdir(parents=True, exist_ok=True)
        pd.read_parquet(SHARED_DATA / "glue" / "rte" / f"{split}.parquet").head(rows).to_parquet(
            tmp_path / "glue" / "rte" / f"{split}.parquet")
    checkpoint = tiny_checkpoint(tmp_path)
    assert main(["--checkpoint", str(checkpoint), "--tasks", "rte", "--seeds", "2", "--data", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "fine-tuning 1 task x 2 seeds = 2 runs" in out and "rte: fine-tuning on 32 examples" in out
    assert re.search(r"rte seed 0: .* \[1/2 runs, ETA .+\]", out) and re.search(r"rte seed 1: .* \[2/2 runs, ", out)


def test_every_cli_uses_the_one_line_parser():
    """A new command built on plain argparse would bring the usage block back."""
    commands = [path for path in ROOT.glob("*/*.py") if path.parts[-2] in ("space", "trainer", "glue", "search",
                                                                          "dashboards")
                and "if __name__ == \"__main__\"" in path.read_text()]
    assert len(commands) >= 10
    plain = [str(path.relative_to(ROOT)) for path in commands if "argparse.ArgumentParser(" in path.read_text()]
    assert plain == []
