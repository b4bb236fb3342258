"""`python -m search.confirm --study NAME --top 5 --seeds 3`: re-train a study's best
architectures with new seeds, to tell a real winner from a lucky seed.

The top `--top` complete trials by the study's objective (its ranking metric,
`search.base.objectives`; repeats and pruned trials do not compete) are crammed again, one after
another in this process, each with `--seeds` seeds, under `--budget` (default: the study's) with
the trial's own training settings, and probed as the study probed them: the tasks and limits the
study run recorded (`probe_tasks`, `probe_limits.*`). Seed k (1, 2, ...) is
`train.seed + 1000 + k`: never the original's, the same for every candidate, so the candidates
meet the same draws of data order and masking. It seeds the probe's fine-tuning too: the interval
covers the whole trial's noise, not pretraining's alone.

Each (candidate, seed) is one MLflow run in the study's experiment, nested under the study run
and tagged `cramnas.kind=confirmation` with `cramnas.confirmation_of` (the original trial run),
`cramnas.original_trial`, `cramnas.seed` and `cramnas.state`
(`search.tracking.tracker.StudyTracker.open_confirmation_run`). A run that fails is recorded FAILED with
its reason and the others go on. Running the same command again skips what completed (or failed:
`--retry-failed` re-runs those) and re-does a run left KILLED or RUNNING, in the same MLflow run.
The table at the end gives, per candidate, its original score and the confirmed mean with a 95%
Student-t interval.

`--baselines crammed-bert-cpu,bert-original-cpu` trains hand-designed configurations beside the
candidates (trainer/configs/<name>.yaml: the config's architecture and its own training recipe, as
the hand design includes one) with the same seeds, under the same budget and probe, so the table
ranks search against hand design. Each is one run per seed, tagged `cramnas.kind=baseline` and
`cramnas.baseline=<name>` (`StudyTracker.open_baseline_run`), skipped or re-done as confirmations
are. `--top 0 --baselines ...` trains the baselines alone.

`--ladder 3x,9x,27x` (or `--target 6e13flops`, `--eta 3`) confirms up a promotion ladder of budgets
instead of under one: every candidate and baseline at the first rung, then the best third of the
candidates (by mean over seeds) and every baseline at the next, and so on; each run is one of the
runs above under its rung's budget, tagged `cramnas.rung`. The rungs, the promotion and the pick
are `search.analysis.ladder`.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
from collections import Counter
from typing import TYPE_CHECKING

from search.analysis import ladder as ladders
from search.analysis.ladder import Candidate, ConfirmPlan, SeedOutcome
from search.base import tags as tag
from search.base.objectives import DEFAULT_OBJECTIVE, Objective, objective_named
from search.base.paths import CONFIGS
from search.base.states import COMPLETE, FAILED
from search.study.next_steps import StudyFlags, data_settings, next_steps
from space.errors import CramnasError, UsageError
from trainer.console import VERBOSE_HELP, CliParser, count, floor_gap, one_line_on_ctrl_c, quiet_libraries
from trainer.data_flags import add_data_arguments
from trainer.regimes import regime_of

if TYPE_CHECKING:  # imported for real only once the flags are checked
    from mlflow.entities import Run

    from search.study.spec import Probe
    from search.tracking.tracker import StudyTracker

SEED_OFFSET = 1000  # confirmation seeds start above the study's, far from any seed a user picks by hand
BASELINES = CONFIGS  # where --baselines names are looked up


def build_parser() -> CliParser:
    """The command line of `python -m search.confirm` (docs/cli.md is generated from it: docs/gen_cli.py)."""
    parser = CliParser(prog="python -m search.confirm",
                                     description="Re-train a study's best architectures with new seeds.")
    parser.add_argument("--study", required=True, help="the study to confirm (its MLflow experiment)")
    parser.add_argument("--top", type=int, default=ladders.LADDER_TOP, help="candidates: the study's best complete trials "
                                                           "(0: none, with --baselines)")
    parser.add_argument("--baselines", help="hand-designed configs to train beside them with the same seeds, "
                                            "e.g. crammed-bert-cpu,bert-original-cpu (trainer/configs/<name>.yaml)")
    parser.add_argument("--seeds", type=int, default=ladders.LADDER_SEEDS, help="new seeds per candidate")
    parser.add_argument("--budget", help="per-run budget: 60s, 5m, 2e7tokens, 1e15flops, cramming-day ... (default: the study's)")
    parser.add_argument("--ladder", help="a promotion ladder instead of one budget: rising rungs, multiples of the "
                                         "study's budget or budgets, e.g. 3x,9x,27x (search/analysis/ladder.py)")
    parser.add_argument("--target", help="a promotion ladder up to this budget: rungs 3x, 9x, 27x ... the study's "
                                         "budget, the target last, e.g. 6e13flops")
    parser.add_argument("--eta", type=int, help=f"with --ladder or --target: the best 1/ETA of the candidates go "
                                                f"up each rung, at least one (default {ladders.DEFAULT_ETA})")
    parser.add_argument("--tracking-uri", help="the MLflow store the search used "
                                               "(default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    add_data_arguments(parser, data_help="local data directory, as given to search.run")
    parser.add_argument("--retry-failed", action="store_true", help="re-run confirmations that failed before")
    parser.add_argument("--estimate", action="store_true", help="print what the runs (the whole ladder) would cost in "
                                                                "device-hours, and exit before any training")
    parser.add_argument("--profile", help="whose recorded costs --estimate prices with: cpu or gpu (default: gpu "
                                          "where CUDA is present)")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def estimate_line(plan: ConfirmPlan, profile: str | None) -> str:
    """What the plan's runs cost, priced with a profile's recorded costs (search/study/estimate.py): the
    ladder's rungs, or one rung of `plan.budget`, one run at a time on one device."""
    import torch
    import yaml

    from glue import ProbeLimits
    from search.base.paths import PROFILES
    from search.study.estimate import Costs, device_time, ladder_hours

    name = profile or ("gpu" if torch.cuda.is_available() else "cpu")
    path = PROFILES / f"{name}.yaml"
    if not path.is_file():
        raise UsageError(f"--profile: {name!r} is not a profile in {PROFILES}; use cpu or gpu")
    costs = Costs.from_profile(yaml.safe_load(path.read_text()), path.name)
    ladder = plan.ladder or ladders.Ladder(plan.budget, (plan.budget,), 1)
    probe_s = 0.0
    if plan.probe is not None:
        probe_s = len(plan.probe.tasks) * ((ProbeLimits(**plan.probe.limits).max_seconds_per_task or 0.0)
                                           + costs.probe_task_s)
    hours = ladder_hours(ladder, len(plan.candidates), len(plan.baselines), len(plan.seeds), costs, path.name, probe_s, 1)
    return (f"estimate: {count(planned_runs(plan), 'run')} ({ladder.describe()}), "
            f"{device_time(hours, 'GPU' if name == 'gpu' else 'CPU')} one after another")


def study_objective(study_run: Run) -> Objective:
    """The objective the study ran with (its study run's `cramnas.objective` tag)."""
    return objective_named(study_run.data.tags.get(tag.OBJECTIVE, DEFAULT_OBJECTIVE), "--study")


def study_probe(study_run: Run, data_dir: str | None) -> Probe | None:
    """The probe the study ran (`probe_tasks`, `probe_limits.*` params of its study run) on
    `data_dir`; None for a study without the probe."""
    from search.study.spec import Probe
    from search.tracking.params import params_under

    params = study_run.data.params
    tasks = params.get("probe_tasks", "")
    if not tasks:
        return None
    limits = params_under(params, "probe_limits")
    if not limits:
        raise UsageError(f"--study: the study run {study_run.info.run_name!r} recorded its probe tasks but not its "
                         "probe limits (a study from before they were recorded); re-run it to confirm it")
    return Probe(tuple(tasks.split(",")), {**limits, "data_dir": data_dir})


def pick_candidates(tracker: StudyTracker, objective: Objective, top: int) -> list[Candidate]:
    """The `top` best complete trials by the objective, as candidates (fewer when there are fewer)."""
    from search.tracking.params import params_under

    study_train = params_under(tracker.study_run().data.params, "train")
    candidates = []
    for rank, row in enumerate(tracker.top_trial_runs(objective, top), start=1):
        result = tracker.read_artifact(row["run_id"], "result.json")
        arch = tracker.read_artifact(row["run_id"], "arch.yaml") or params_under(row, "arch")
        if not arch:
            raise UsageError(f"--study: trial {row['trial']} (run {row['run_id']}) recorded no architecture "
                             "(no arch.yaml, no arch.* params); lower --top to leave it out")
        fingerprint = row.get(tag.column(tag.FINGERPRINT))
        candidates.append(Candidate(
            rank, int(row["trial"]), row["run_id"], float(row[f"metrics.{objective.rank_metric}"]), arch,
            params_under(row, "train") or study_train, fingerprint if isinstance(fingerprint, str) else None,
            ((result or {}).get("cram") or {}).get("data_fingerprint")))
    return candidates


def load_baselines(names: str) -> list[Candidate]:
    """The hand-designed configs `names` (comma-separated, trainer/configs/<name>.yaml) as
    candidates with their own architecture and training recipe."""
    from trainer.config import load_run_config

    available = sorted(path.stem for path in BASELINES.glob("*.yaml"))
    wanted = list(dict.fromkeys(name.strip() for name in names.split(",") if name.strip()))  # in order, once each
    unknown = [name for name in wanted if name not in available]
    if not wanted or unknown:
        raise UsageError(f"--baselines: unknown config {(unknown or [names])[0]!r}; available: {', '.join(available)}")
    baselines = []
    for name in wanted:
        config = load_run_config(BASELINES / f"{name}.yaml")
        baselines.append(Candidate(None, None, None, None, config.arch.to_dict(), config.train.to_dict(),
                                   config.arch.fingerprint(), None, baseline=name))
    return baselines


def make_plan(args: argparse.Namespace) -> ConfirmPlan:
    """Check every input, pick the candidates and prepare the data; raises a CramnasError (one
    line) before any training."""
    from search.tracking.params import params_under
    from search.tracking.stores import check_store, existing_store
    from search.tracking.tracker import StudyTracker
    from trainer.budget import Budget

    if args.top < (0 if args.baselines else 1):
        raise UsageError(f"--top: must be at least 1 (0 only with --baselines), got {args.top}")
    if args.seeds < 1:
        raise UsageError(f"--seeds: must be at least 1, got {args.seeds}")
    ladders.check_flags(args)
    baselines = load_baselines(args.baselines) if args.baselines else []
    budget = Budget.parse(args.budget) if args.budget else None
    uri = check_store(existing_store(args.tracking_uri))  # written to, but not created for a typo
    tracker = StudyTracker(uri, args.study)
    if tracker.client.get_experiment_by_name(args.study) is None:
        raise UsageError(f"--study: no study {args.study!r} in MLflow at {uri}; "
                         "pass the study name search.run printed and the --tracking-uri it used")
    study_run = tracker.study_run()
    objective = study_objective(study_run)
    metric = objective.rank_metric
    ladder = None
    if budget is None:
        if "budget" not in study_run.data.params:
            if ladders.wanted(args):
                raise UsageError(f"--ladder: study {args.study!r} recorded no budget per trial to climb from; "
                                 "confirm it under one --budget instead, e.g. --budget 60s")
            raise UsageError(f"--budget: study {args.study!r} recorded no budget; pass one, e.g. --budget 60s")
        budget = Budget.parse(study_run.data.params["budget"])
        if ladders.wanted(args):
            ladder = ladders.ladder_of(args, budget)
            budget = ladder.rungs[-1]  # the most any run trains on: what the data is prepared for
    probe = study_probe(study_run, args.data)
    candidates = pick_candidates(tracker, objective, args.top) if args.top else []
    if args.top and not candidates:
        raise UsageError(f"--study: {args.study!r} has no complete trial with {metric} to confirm; "
                         f"run more trials (python -m search.run --study {args.study} --resume --trials N)")
    if len(candidates) < args.top:
        print(f"note: study {args.study} has {count(len(candidates), 'complete trial')} with {metric}; "
              f"confirming {'it' if len(candidates) == 1 else 'those'}")
    # Imported only now (torch, datasets: seconds), so that a wrong study name fails fast.
    import torch

    from glue.data import resolve_tasks
    from trainer.data import CorpusSource, prepare_data, tokens_to_prepare

    if probe is not None:
        resolve_tasks(",".join(probe.tasks), args.data)  # every task present, or one clear error
    # The study's seed, not a baseline config's: baselines-only runs meet the candidates' seeds too.
    base_seed = int((candidates[0].train if candidates else params_under(study_run.data.params, "train")).get("seed", 0))
    seeds = [base_seed + SEED_OFFSET + k for k in range(1, args.seeds + 1)]

    plan = ConfirmPlan(args.study, tracker, objective, budget, seeds, candidates, baselines, probe,
                       retry_failed=args.retry_failed, ladder=ladder)
    if args.estimate:  # priced before any data is prepared
        return plan
    source = CorpusSource.from_args(data_dir=args.data, corpus=args.corpus, gpu=torch.cuda.is_available())
    for vocab, seq in sorted({candidate.data_shape for candidate in plan.configurations}):
        plan.data[vocab, seq] = prepare_data(source, vocab_size=vocab, seq_len=seq, cache_dir=args.cache_dir,
                                             max_tokens=tokens_to_prepare(source, budget))
    for candidate in candidates:
        prepared = plan.data[candidate.data_shape].fingerprint
        if candidate.data_fingerprint and candidate.data_fingerprint != prepared:
            print(f"warning: trial {candidate.trial} was trained on other data (fingerprint "
                  f"{candidate.data_fingerprint}, here {prepared}); pass the --data or --corpus the search used")
    return plan


def confirm_one(plan: ConfirmPlan, candidate: Candidate, index: int, seed: int) -> SeedOutcome:
    """Cram and probe one (candidate or baseline, seed) in its MLflow run, or reuse the run that did."""
    tracker, budget, metric = plan.tracker, plan.budget, plan.objective.rank_metric
    done = candidate.find_run(tracker, seed, budget.text)
    label = f"{candidate.label} seed {seed}"
    if done is not None and done.info.status == "FINISHED":
        print(f"{label}: complete before (run {done.info.run_id}), skipped")
        return SeedOutcome(candidate, seed, done.info.run_id, COMPLETE, done.data.metrics.get(metric), earlier=True,
                           metrics=dict(done.data.metrics))
    if done is not None and done.info.status == "FAILED" and not plan.retry_failed:
        reason = done.data.tags.get(tag.FAILURE_REASON)
        print(f"{label}: failed before (run {done.info.run_id}: {reason}), kept; --retry-failed re-runs it")
        return SeedOutcome(candidate, seed, done.info.run_id, FAILED, None, reason, earlier=True)
    train = {**candidate.train, "seed": seed}
    run_id = candidate.open_run(tracker, seed, index, train, budget.text)
    rung_tag = {tag.RUNG: plan.rung}  # None, outside a ladder, is no tag
    print(f"{label}: {'re-doing' if done is not None else 'cramming'} under {budget.text} (run {run_id}) ...",
          flush=True)
    started = time.perf_counter()
    try:
        # Imports torch and Ray (seconds): only once a run is due, so bad input fails fast.
        from search.study.report import trial_metrics
        from search.study.trial import cram_and_probe
        from space.arch import ArchConfig
        from trainer.config import TrainConfig

        probe = None if plan.probe is None else plan.probe.with_seed(seed)
        cram, probe_result = cram_and_probe(ArchConfig.from_dict(candidate.arch), TrainConfig.from_dict(train),
                                            plan.data[candidate.data_shape], budget, probe)
        metrics = trial_metrics(cram, probe_result)
        broken = sorted(name for name, value in metrics.items() if not math.isfinite(value))
        if broken:  # e.g. a loss that diverged only on the held-out data
            raise FloatingPointError(f"non-finite {', '.join(broken)}")
    except KeyboardInterrupt:
        tracker.finish_run(run_id, FAILED, reason="interrupted (Ctrl-C)", tags=rung_tag, cut_short=True)
        raise
    except Exception as error:  # noqa: BLE001 - any failure is this run's, recorded with its reason
        reason = f"{type(error).__name__}: {error}"[:2000]
        tracker.finish_run(run_id, FAILED, {"seconds": time.perf_counter() - started}, reason=reason, tags=rung_tag,
                           artifacts={"arch.yaml": candidate.arch, "traceback.txt": traceback.format_exc()[-4000:]})
        print(f"{label}: failed: {reason}")
        return SeedOutcome(candidate, seed, run_id, FAILED, None, reason)
    tracker.finish_run(run_id, COMPLETE, metrics, tags=rung_tag,
                       artifacts={"arch.yaml": candidate.arch, "result.json": {"cram": cram, "probe": probe_result}},
                       loss_curve=cram["loss_curve"])
    # An mlm study ranks by the validation loss itself: said once.
    loss = "" if metric == "validation_loss" else f"validation loss {metrics['validation_loss']:.4f}, "
    print(f"{label}: {metric} {metrics[metric]:.4f} in {time.perf_counter() - started:.1f} s; {loss}"
          f"{floor_gap(metrics['nats_below_floor'], 4)} the corruption floor {metrics['corruption_floor']:.4f}, "
          f"regime {regime_of(metrics)}")
    return SeedOutcome(candidate, seed, run_id, COMPLETE, metrics[metric], metrics=metrics)


def print_table(plan: ConfirmPlan, outcomes: list[SeedOutcome]) -> None:
    from rich.console import Console
    from rich.table import Table

    from search.analysis.stats import mean_interval

    objective = plan.objective
    table = Table(title=f"confirmation of study {plan.study} under {plan.budget.text}, seeds "
                        f"{', '.join(map(str, plan.seeds))}: {objective.rank_metric} "
                        f"({'higher' if objective.higher_is_better else 'lower'} is better)")
    for column in ("rank", "trial", "architecture", "original", "confirmed (95% CI)", "n", "failed", "rank now"):
        table.add_column(column, no_wrap=column != "architecture")
    summaries = []
    for candidate in plan.configurations:
        scores = [o.score for o in outcomes if o.candidate is candidate and o.score is not None]
        failed = sum(o.candidate is candidate and o.state == FAILED for o in outcomes)
        summaries.append((candidate, mean_interval(scores) if scores else None, len(scores), failed))
    ranked = sorted((s for s in summaries if s[1] is not None), key=lambda s: objective.sort_key(s[1][0]))
    rank_now = {id(s[0]): position for position, s in enumerate(ranked, start=1)}
    for candidate, summary, n, failed in summaries:
        trial, architecture = str(candidate.trial), candidate.describe()
        if candidate.baseline is not None:
            trial, architecture = "baseline", f"{candidate.baseline}: {architecture}"
        table.add_row("-" if candidate.rank is None else str(candidate.rank), trial, architecture,
                      "-" if candidate.score is None else f"{candidate.score:.4f}", ladders.interval_text(summary),
                      str(n), str(failed), str(rank_now.get(id(candidate), "-")))
    Console(width=None if sys.stdout.isatty() else 160).print(table)


def planned_runs(plan: ConfirmPlan) -> int:
    """The runs the command trains at most: every configuration with every seed, at every rung it can reach."""
    if plan.ladder is None:
        return len(plan.configurations) * len(plan.seeds)
    return sum((climbers + len(plan.baselines)) * len(plan.seeds) for climbers in plan.ladder.climbers(len(plan.candidates)))


def announce(plan: ConfirmPlan, total: int) -> str:
    baselines = f" and baselines {', '.join(b.baseline for b in plan.baselines)}" if plan.baselines else ""
    if plan.ladder is None:
        where = f"under {plan.budget.text}: {total} run(s)"
    else:
        where = (f"up the ladder {plan.ladder.describe()}, the best 1/{plan.ladder.eta} going up each rung: "
                 f"at most {total} run(s)")
    return (f"study {plan.study}: confirming the top {len(plan.candidates)} by {plan.objective.rank_metric}{baselines} "
            f"with seeds {', '.join(map(str, plan.seeds))} {where}; MLflow {plan.tracker.uri}")


def confirm_all(plan: ConfirmPlan, outcomes: list[SeedOutcome]) -> list[ladders.Rung]:
    """Every run of the plan, each outcome appended to `outcomes` as it comes (a Ctrl-C keeps the
    count): up its ladder, whose rungs it returns, or every configuration with every seed."""
    if plan.ladder is not None:
        return ladders.climb(plan, confirm_one, outcomes)
    for candidate in plan.configurations:
        for index, seed in enumerate(plan.seeds, start=1):
            outcomes.append(confirm_one(plan, candidate, index, seed))
    return []


@one_line_on_ctrl_c
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_libraries(args.verbose)
    # As in search.run: search.tracking.retry.Retry retries a tracking server that is away, not MLflow's
    # own HTTP retries, which take minutes per call.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    from mlflow.exceptions import MlflowException

    from search.tracking.retry import TrackingError

    try:
        plan = make_plan(args)
    # Every cramnas user error, and MLflow's own for a store it cannot read (a wrong URI).
    except (CramnasError, MlflowException) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.estimate:
        try:
            print(estimate_line(plan, args.profile))
        except CramnasError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        return 0
    total = planned_runs(plan)
    print(announce(plan, total))
    of_total = f"of {'at most ' if plan.ladder else ''}{total} done are kept"
    outcomes: list[SeedOutcome] = []
    try:
        rungs = confirm_all(plan, outcomes)
    except KeyboardInterrupt:
        print(f"interrupted: the run in flight is marked KILLED; run the same command again to finish "
              f"({len(outcomes)} {of_total})")
        return 130
    except TrackingError as error:  # MLflow went away for longer than Retry waits
        print(f"error: {error}; run the same command again once MLflow is back ({len(outcomes)} {of_total})",
              file=sys.stderr)
        return 1
    if plan.ladder is not None:
        ladders.print_ladder(plan, rungs)
    else:
        print_table(plan, outcomes)
    counts = Counter((o.state, o.earlier) for o in outcomes)
    print(f"{len(outcomes)} run(s): {counts[COMPLETE, False]} complete now, "
          f"{counts[FAILED, False]} failed now, {counts[COMPLETE, True]} complete before "
          f"(skipped), {counts[FAILED, True]} failed before (kept)")
    flags = StudyFlags(plan.study, plan.tracker.uri, data=data_settings(args.data, args.corpus, args.cache_dir))
    report, export = (("each candidate's loss against the budget", "the pick: the best at the highest rung")
                      if plan.ladder is not None else
                      ("ranks the confirmed configurations, against the baselines", "the best confirmed configuration"))
    print(next_steps([("report", f"{flags.report()}   # {report}"), ("export", f"{flags.export()}   # {export}")]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
