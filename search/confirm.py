"""`python -m search.confirm --study NAME --top 5 --seeds 3`: re-train a study's best
architectures with new seeds, to tell a real winner from a lucky seed.

The top `--top` complete trials by the study's objective (its probe score for `probe+throughput`;
repeats and pruned trials do not compete) are crammed again, one after another in this process,
each with `--seeds` seeds, under `--budget` (default: the study's) with the trial's own training
settings, and probed as the study probed them (same tasks and limits, from the trial's
`result.json`). Seed k (1, 2, ...) is `train.seed + 1000 + k`: never the original's, the same for
every configuration, so the configurations meet the same draws of data order and masking. It seeds
the probe's fine-tuning too: the interval covers the whole trial's noise, not pretraining's alone.

Each (configuration, seed) is one MLflow run in the study's experiment, nested under the study run
and tagged `cramnas.kind=confirmation` with `cramnas.confirmation_of` (the original trial run),
`cramnas.original_trial`, `cramnas.seed` and `cramnas.status` (`search.tracking.confirmation_run`).
A run that fails is recorded FAILED with its reason and the others go on. Running the same command
again skips what completed (or failed: `--retry-failed` re-runs those) and re-does a run left
KILLED or RUNNING, in the same MLflow run. The table at the end gives, per configuration, its
original score and the confirmed mean with a 95% Student-t interval.
"""

from __future__ import annotations

import argparse
import ast
import math
import os
import sys
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from search.run import PROFILES, UsageError, default_profile, load_profile

SEED_OFFSET = 1000  # confirmation seeds start above the study's, far from any seed a user picks by hand


@dataclass
class Config:
    """One configuration to confirm: an original trial and what it was trained with."""

    rank: int
    trial: int
    run_id: str
    score: float
    arch: dict[str, Any]
    train: dict[str, Any]
    fingerprint: str | None
    probe: dict[str, Any] | None  # {"tasks": [...], "limits": {...}} without the seed, or no probe
    data_fingerprint: str | None

    @property
    def data_shape(self) -> tuple[int, int]:
        from space.arch import ArchConfig

        return (int(self.arch.get("vocab_size", ArchConfig.vocab_size)),
                int(self.arch.get("max_seq_len", ArchConfig.max_seq_len)))


@dataclass
class Plan:
    study: str
    tracker: Any  # search.tracking.StudyTracker
    metric: str  # the trial metric ranked on (`validation_loss` or `probe_average`)
    mode: str  # min or max
    budget: Any  # trainer.budget.Budget
    seeds: list[int]
    configs: list[Config]
    data: dict[tuple[int, int], Any] = field(default_factory=dict)  # (vocab, seq) -> PretrainData
    retry_failed: bool = False


@dataclass
class Outcome:
    config: Config
    seed: int
    run_id: str
    state: str  # complete | failed
    score: float | None
    reason: str | None = None
    earlier: bool = False  # a finished run of an earlier invocation, kept as it was


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m search.confirm",
                                     description="Re-train a study's best architectures with new seeds.")
    parser.add_argument("--study", required=True, help="the study to confirm (its MLflow experiment)")
    parser.add_argument("--top", type=int, default=5, help="configurations: the study's best complete trials")
    parser.add_argument("--seeds", type=int, default=3, help="new seeds per configuration")
    parser.add_argument("--budget", help="per-run budget: 60s, 5m, 2e7tokens ... (default: the study's)")
    parser.add_argument("--tracking-uri", help="the MLflow store the search used "
                                               "(default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--data", help="local data directory, as given to search.run")
    source.add_argument("--corpus", help="hub dataset id for pretraining, as given to search.run")
    parser.add_argument("--cache-dir", help="token cache (default: $CRAMNAS_CACHE or ~/.cache/cramnas)")
    parser.add_argument("--retry-failed", action="store_true", help="re-run confirmations that failed before")
    return parser.parse_args(argv)


def _param_value(text: str) -> Any:
    """An MLflow param back to the value it was logged from (`str(value)`): `1e-12`, `True`,
    `[0.9, 0.98]`, `None`; names such as `geglu` stay strings."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _params(row: dict[str, Any], prefix: str) -> dict[str, Any]:
    """`params.arch.hidden` -> `{"hidden": 64}` from a `trial_runs` row (a param the run lacks is NaN there)."""
    start = f"params.{prefix}."
    return {key[len(start):]: _param_value(value) for key, value in row.items()
            if key.startswith(start) and isinstance(value, str)}


def _probe_spec(result: dict | None, study_tasks: str, data_dir: str | None) -> dict[str, Any] | None:
    """What the study's probe ran, as `cram_and_probe` takes it (the seed is each run's own).

    The trial's `result.json` holds the probe's exact settings; a run closed on resume without it
    falls back to the study's tasks and the device profile's limits."""
    if not study_tasks:
        return None
    probe = (result or {}).get("probe")
    if probe:
        settings = probe["settings"]
        limits = {"max_train_examples": settings["max_train_examples"], "max_seconds_per_task": settings["max_seconds"],
                  "epochs": settings["epochs"], "batch_size": settings["batch_size"], "lr": settings["lr"],
                  "pooling": settings["pooling"]}
        return {"tasks": list(probe["tasks"]), "limits": {**limits, "data_dir": data_dir}}
    profile = load_profile(PROFILES / f"{default_profile()}.yaml")
    return {"tasks": study_tasks.split(","), "limits": {**profile["probe"]["limits"], "data_dir": data_dir}}


def make_plan(args: argparse.Namespace) -> Plan:
    """Check every input, pick the configurations and prepare the data; raises UsageError (or a
    library's one-line ValueError) before any training."""
    from search.export import RANKINGS
    from search.tracking import StudyTracker, check_store, existing_store
    from trainer.budget import Budget

    if args.top < 1:
        raise UsageError(f"--top: must be at least 1, got {args.top}")
    if args.seeds < 1:
        raise UsageError(f"--seeds: must be at least 1, got {args.seeds}")
    budget = Budget.parse(args.budget) if args.budget else None
    uri = check_store(existing_store(args.tracking_uri))  # written to, but not created for a typo
    tracker = StudyTracker(uri, args.study)
    if tracker.client.get_experiment_by_name(args.study) is None:
        raise UsageError(f"--study: no study {args.study!r} in MLflow at {uri}; "
                         "pass the study name search.run printed and the --tracking-uri it used")
    study_run = tracker.study_run()
    objective = study_run.data.tags.get("cramnas.objective", "probe")
    metric, mode = RANKINGS["mlm" if objective == "mlm" else "probe"]
    if budget is None:
        if "budget" not in study_run.data.params:
            raise UsageError(f"--budget: study {args.study!r} recorded no budget; pass one, e.g. --budget 60s")
        budget = Budget.parse(study_run.data.params["budget"])
    top = tracker.top_trial_runs(metric, mode, args.top)
    if not top:
        raise UsageError(f"--study: {args.study!r} has no complete trial with {metric} to confirm; "
                         f"run more trials (python -m search.run --study {args.study} --resume --trials N)")
    if len(top) < args.top:
        print(f"note: study {args.study} has {len(top)} complete trials with {metric}; confirming those")

    study_train = _params({f"params.{k}": v for k, v in study_run.data.params.items()}, "train")
    study_tasks = study_run.data.params.get("probe_tasks", "")
    configs = []
    for rank, row in enumerate(top, start=1):
        result = tracker.read_artifact(row["run_id"], "result.json")
        arch = tracker.read_artifact(row["run_id"], "arch.yaml") or _params(row, "arch")
        if not arch:
            raise UsageError(f"--study: trial {row['trial']} (run {row['run_id']}) recorded no architecture "
                             "(no arch.yaml, no arch.* params); lower --top to leave it out")
        fingerprint = row.get("tags.cramnas.fingerprint")
        configs.append(Config(
            rank, int(row["trial"]), row["run_id"], float(row[f"metrics.{metric}"]), arch,
            _params(row, "train") or study_train, fingerprint if isinstance(fingerprint, str) else None,
            _probe_spec(result, study_tasks, args.data), ((result or {}).get("cram") or {}).get("data_fingerprint")))
    # Imported only now (torch, datasets: seconds), so that a wrong study name fails fast.
    from glue.data import resolve_tasks
    from trainer.data import CorpusSource, prepare_data

    tasks = sorted({task for config in configs if config.probe for task in config.probe["tasks"]})
    if tasks:
        resolve_tasks(",".join(tasks), args.data)  # every task present, or one clear error
    base_seed = int(configs[0].train.get("seed", 0))
    seeds = [base_seed + SEED_OFFSET + k for k in range(1, args.seeds + 1)]

    plan = Plan(args.study, tracker, metric, mode, budget, seeds, configs, retry_failed=args.retry_failed)
    source = CorpusSource.from_args(data_dir=args.data, corpus=args.corpus)
    for vocab, seq in sorted({config.data_shape for config in configs}):
        plan.data[vocab, seq] = prepare_data(source, vocab_size=vocab, seq_len=seq, cache_dir=args.cache_dir)
    for config in configs:
        prepared = plan.data[config.data_shape].fingerprint
        if config.data_fingerprint and config.data_fingerprint != prepared:
            print(f"warning: trial {config.trial} was trained on other data (fingerprint {config.data_fingerprint}, "
                  f"here {prepared}); pass the --data or --corpus the search used")
    return plan


def confirm_one(plan: Plan, config: Config, index: int, seed: int) -> Outcome:
    """Cram and probe one (configuration, seed) in its MLflow run, or reuse the run that did."""
    tracker, budget = plan.tracker, plan.budget
    done = tracker.find_confirmation_run(config.run_id, seed, budget.text)
    label = f"trial {config.trial} seed {seed}"
    if done is not None and done.info.status == "FINISHED":
        print(f"{label}: complete before (run {done.info.run_id}), skipped")
        return Outcome(config, seed, done.info.run_id, "complete", done.data.metrics.get(plan.metric), earlier=True)
    if done is not None and done.info.status == "FAILED" and not plan.retry_failed:
        reason = done.data.tags.get("cramnas.failure_reason")
        print(f"{label}: failed before (run {done.info.run_id}: {reason}), kept; --retry-failed re-runs it")
        return Outcome(config, seed, done.info.run_id, "failed", None, reason, earlier=True)
    train = {**config.train, "seed": seed}
    run_id = tracker.confirmation_run(config.run_id, config.trial, seed, index, config.arch, train, budget.text,
                                      config.fingerprint)
    print(f"{label}: {'re-doing' if done is not None else 'cramming'} under {budget.text} (run {run_id}) ...",
          flush=True)
    started = time.perf_counter()
    try:
        # Imports torch and Ray (seconds): only once a run is due, so bad input fails fast.
        from search.trial import cram_and_probe, trial_metrics
        from space.arch import ArchConfig
        from trainer.config import TrainConfig

        probe = None if config.probe is None else {**config.probe, "limits": {**config.probe["limits"], "seed": seed}}
        cram, probe_result = cram_and_probe(ArchConfig.from_dict(config.arch), TrainConfig.from_dict(train),
                                            plan.data[config.data_shape], budget, probe)
        metrics = trial_metrics(cram, probe_result)
        broken = sorted(name for name, value in metrics.items() if not math.isfinite(value))
        if broken:  # e.g. a loss that diverged only on the held-out data
            raise FloatingPointError(f"non-finite {', '.join(broken)}")
    except KeyboardInterrupt:
        tracker.finish_trial(run_id, "KILLED", {}, {"status": "failed", "failure_reason": "interrupted (Ctrl-C)"})
        raise
    except Exception as error:  # noqa: BLE001 - any failure is this run's, recorded with its reason
        reason = f"{type(error).__name__}: {error}"[:2000]
        tracker.finish_trial(run_id, "FAILED", {"seconds": time.perf_counter() - started},
                             {"status": "failed", "failure_reason": reason},
                             {"arch.yaml": config.arch, "traceback.txt": traceback.format_exc()[-4000:]})
        print(f"{label}: failed: {reason}")
        return Outcome(config, seed, run_id, "failed", None, reason)
    tracker.finish_trial(run_id, "FINISHED", metrics, {"status": "complete"},
                         {"arch.yaml": config.arch, "result.json": {"cram": cram, "probe": probe_result}},
                         loss_curve=cram["loss_curve"])
    print(f"{label}: {plan.metric} {metrics[plan.metric]:.4f} in {time.perf_counter() - started:.1f} s")
    return Outcome(config, seed, run_id, "complete", metrics[plan.metric])


def mean_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float | None]:
    """Mean and the half-width of its Student-t confidence interval (None for a single value)."""
    from scipy import stats

    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    sem = stats.sem(values)
    if sem == 0:
        return mean, 0.0
    low, high = stats.t.interval(confidence, len(values) - 1, loc=mean, scale=sem)
    return mean, (high - low) / 2


def print_table(plan: Plan, outcomes: list[Outcome]) -> None:
    from rich.console import Console
    from rich.table import Table

    from search.view import describe
    from space.arch import ArchConfig

    table = Table(title=f"confirmation of study {plan.study} under {plan.budget.text}, seeds "
                        f"{', '.join(map(str, plan.seeds))}: {plan.metric} "
                        f"({'lower' if plan.mode == 'min' else 'higher'} is better)")
    for column in ("rank", "trial", "architecture", "original", "confirmed (95% CI)", "n", "failed", "rank now"):
        table.add_column(column, no_wrap=column != "architecture")
    summaries = []
    for config in plan.configs:
        scores = [o.score for o in outcomes if o.config is config and o.score is not None]
        failed = sum(o.config is config and o.state == "failed" for o in outcomes)
        summaries.append((config, mean_interval(scores) if scores else None, len(scores), failed))
    sign = 1.0 if plan.mode == "min" else -1.0
    ranked = sorted((s for s in summaries if s[1] is not None), key=lambda s: sign * s[1][0])
    rank_now = {id(s[0]): position for position, s in enumerate(ranked, start=1)}
    for config, summary, n, failed in summaries:
        if summary is None:
            confirmed = "-"
        else:
            mean, half = summary
            confirmed = f"{mean:.4f}" + (f" ± {half:.4f}" if half is not None else " (one seed)")
        # Defaults first: an arch read back from params may leave a field out.
        architecture = describe({**ArchConfig().to_dict(), **config.arch})
        table.add_row(str(config.rank), str(config.trial), architecture, f"{config.score:.4f}", confirmed,
                      str(n), str(failed), str(rank_now.get(id(config), "-")))
    Console(width=None if sys.stdout.isatty() else 160).print(table)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per small YAML file is noise
    # As in search.run: search.tracking.Retry retries a tracking server that is away, not MLflow's
    # own HTTP retries, which take minutes per call.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    from search.tracking import TrackingError

    try:
        plan = make_plan(args)
    except ValueError as error:  # every cramnas user error (and MLflow's tracking errors) is one
        print(f"error: {error}", file=sys.stderr)
        return 2
    total = len(plan.configs) * len(plan.seeds)
    print(f"study {plan.study}: confirming the top {len(plan.configs)} by {plan.metric} with seeds "
          f"{', '.join(map(str, plan.seeds))} under {plan.budget.text}: {total} run(s); MLflow {plan.tracker.uri}")
    outcomes = []
    try:
        for config in plan.configs:
            for index, seed in enumerate(plan.seeds, start=1):
                outcomes.append(confirm_one(plan, config, index, seed))
    except KeyboardInterrupt:
        print(f"interrupted: the run in flight is marked KILLED; run the same command again to finish "
              f"({len(outcomes)} of {total} done are kept)")
        return 130
    except TrackingError as error:  # MLflow went away for longer than Retry waits
        print(f"error: {error}; run the same command again once MLflow is back ({len(outcomes)} of {total} "
              "done are kept)", file=sys.stderr)
        return 1
    print_table(plan, outcomes)
    counts = Counter((o.state, o.earlier) for o in outcomes)
    print(f"{total} confirmation run(s): {counts['complete', False]} complete now, "
          f"{counts['failed', False]} failed now, {counts['complete', True]} complete before "
          f"(skipped), {counts['failed', True]} failed before (kept)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
