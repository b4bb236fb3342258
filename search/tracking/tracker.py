"""MLflow conventions for cramnas studies: one experiment per study, one run per trial.

Layout (which tags each kind of run carries, and what they mean: `search.base.tags`):
- experiment = study (same name); artifacts of a SQLite store go beside the database file;
- one *study run*, named `study <name>` so that it stands out among its trials: the study's
  settings as tags and params, its training settings as `train.*` params and the probe's limits as
  `probe_limits.*` params;
- one *trial run* per trial number, nested under the study run (`mlflow.parentRunId`, which the UI
  groups by), named by trial and architecture (`t0007 4x256/4h geglu pre-norm rotary`): params
  `arch.<field>`, `train.<field>` and `budget`; metrics `train_loss`, `tokens_per_s`, ... over
  tokens seen, final `validation_loss`, `glue.<task>.<metric>`, `probe_average`; artifacts
  `arch.yaml`, `result.json` and, for a saved checkpoint (`search.run --save-checkpoints`), its
  Hugging Face export `hf_model/`;
- one *confirmation run* per (trial, seed, budget) that `search.confirm` re-trains and one
  *baseline run* per (hand-designed config, seed, budget) it trains beside them, both nested,
  named `confirm-t0007-s1` and `<config> s1` (seed index last).

Every run is found again by its tags, never remembered in memory, so a driver that crashes and
resumes reuses the study run and each trial's run instead of creating second ones. All calls go
through `MlflowClient` with explicit run ids (trials log from Ray workers, where MLflow's global
active-run state would be wrong) and through `search.tracking.retry.Retry`.
"""

from __future__ import annotations

import json
import math
import re
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from mlflow import MlflowClient
from mlflow.entities import Metric, Param, Run, RunTag

from search.base import attrs
from search.base import tags as tag
from search.base.objectives import Objective
from search.base.states import COMPLETE, RUNNING, STATES
from search.tracking.params import flatten, trial_params
from search.tracking.retry import Retry, TrackingError, TrackingUnavailable, first_line, is_transient
from search.tracking.stores import resolve_uri, sqlite_path
from trainer.regimes import regime_of


def _numbers(metrics: Mapping[str, Any]) -> dict[str, float]:
    flat = flatten(metrics)
    for name, value in flat.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"metric {name}: expected a number, got {value!r}")
    return {name: float(value) for name, value in flat.items()}


def _now_ms() -> int:
    return int(time.time() * 1000)


# ---- the study ----------------------------------------------------------------------------------

class StudyTracker:
    """The MLflow side of one study. Cheap to build and picklable, so each Ray worker can hold one.

    Only the driver calls `start_study` and `finish_study`; workers find the study run by its tag.
    """

    def __init__(self, uri: str | None, study_name: str, *, artifact_root: str | None = None,
                 retry: Retry | None = None) -> None:
        self.uri = resolve_uri(uri)
        self.study_name = study_name
        # MLflow puts a SQLite store's artifacts under the *working directory's* ./mlruns; keep them
        # beside the database instead, so that a study is one folder wherever the driver ran.
        sqlite = sqlite_path(self.uri)
        if artifact_root is None and sqlite is not None:
            artifact_root = str(sqlite.parent / "mlruns")
        self.artifact_root = artifact_root
        self.retry = retry or Retry()
        self._client: MlflowClient | None = None
        self._experiment_id: str | None = None
        self._study_run: Run | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The client holds a database engine, which does not pickle; a worker opens its own.
        return {**self.__dict__, "_client": None}

    @property
    def client(self) -> MlflowClient:
        if self._client is None:
            self._client = MlflowClient(tracking_uri=self.uri)
        return self._client

    def _call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.retry(f"{what} (study {self.study_name!r}, MLflow at {self.uri})", fn, *args, **kwargs)

    def reachable(self) -> bool:
        """One untried call to the store: is it answering now? (`PendingWrites` asks before replaying.)"""
        try:
            self.client.search_experiments(max_results=1)
        except Exception as error:  # transient ones mean "not now"; others are bugs
            if is_transient(error):
                return False
            raise
        return True

    def _log_batch(self, what: str, run_id: str, metrics: Sequence[Metric] = (),
                   params: Mapping[str, str] | None = None, tags: Mapping[str, str] | None = None) -> None:
        # Entities are built once, outside the retried call, so that a retry after a half-applied
        # batch re-sends identical metrics (same timestamps), which MLflow de-duplicates.
        self._call(what, self.client.log_batch, run_id, metrics=list(metrics),
                   params=[Param(k, v) for k, v in (params or {}).items()],
                   tags=[RunTag(k, v) for k, v in (tags or {}).items()], synchronous=True)

    # ---- experiment and study run ----

    def experiment_id(self, create: bool = False) -> str:
        if self._experiment_id is None:
            self._experiment_id = self._call("finding the experiment", self._find_experiment, create)
        return self._experiment_id

    def _find_experiment(self, create: bool) -> str:
        experiment = self.client.get_experiment_by_name(self.study_name)
        if experiment is None:
            if not create:
                raise TrackingError(f"MLflow at {self.uri} has no experiment {self.study_name!r}; "
                                    "the study driver creates it with start_study")
            location = None
            if self.artifact_root is not None:
                slug = re.sub(r"[^A-Za-z0-9._-]+", "_", self.study_name)
                location = f"{self.artifact_root.rstrip('/')}/{slug}"
            return self.client.create_experiment(self.study_name, artifact_location=location)
        if experiment.lifecycle_stage != "active":
            raise TrackingError(f"MLflow at {self.uri}: experiment {self.study_name!r} is deleted; "
                                f"restore it (mlflow experiments restore --experiment-id "
                                f"{experiment.experiment_id}) or choose another study name")
        return experiment.experiment_id

    def _search(self, filter_string: str, max_results: int = 1000) -> list[Run]:
        """Every active run of the study's experiment matching the filter, oldest first."""
        runs: list[Run] = []
        token = None
        while True:
            page = self._call("searching runs", self.client.search_runs, [self.experiment_id()],
                              filter_string, max_results=max_results,
                              order_by=["attributes.start_time ASC"], page_token=token)
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def _find_study_run(self) -> Run | None:
        runs = self._search(tag.where(tag.KIND, tag.STUDY))
        return runs[0] if runs else None

    def start_study(self, info: Mapping[str, Any]) -> str:
        """Create the study run, or reuse it on resume; return its run id.

        `info` holds the study's settings, e.g. `{"controller": "tpe", "objective":
        "validation_loss", "space": "space/spaces/crammed_bert.yaml", "budget": "600s",
        "code_version": "...", "train": TrainConfig.to_dict()}`. Scalars become tags
        (`cramnas.<key>`) and params; nested mappings become dotted params (`train.lr`). On resume
        the tags are updated (the code version may have moved on) and new params are added, but a
        param keeps its first value: MLflow params are write-once, and whether a changed setting may
        resume the study is the study store's decision, not the tracker's.
        """
        self.experiment_id(create=True)
        tags = {**tag.as_tags({k: v for k, v in info.items() if not isinstance(v, Mapping)}), tag.KIND: tag.STUDY}
        params = {name: str(value) for name, value in flatten(info).items()}

        def find_or_create() -> Run:
            # One retried unit: a retry after a lost "created" reply finds the run instead of
            # creating a second one.
            run = self._find_study_run()
            if run is None:
                run = self.client.create_run(self.experiment_id(), tags=tags, run_name=tag.study_run_name(self.study_name))
            return run

        run = self._call("starting the study run", find_or_create)
        run_id = run.info.run_id
        if run.info.status != "RUNNING":  # a resumed study that had been finished or killed
            self._call("reopening the study run", self.client.update_run, run_id, status="RUNNING")
        new_params = {k: v for k, v in params.items() if k not in run.data.params}
        self._log_batch("logging the study settings", run_id, params=new_params, tags=tags)
        self._study_run = None  # `run` predates the batch just logged: read it again when needed
        return run_id

    def study_run(self) -> Run:
        """The study run (found by its tag and cached: workers never call `start_study`)."""
        if self._study_run is None:
            run = self._find_study_run()
            if run is None:
                raise TrackingError(f"MLflow at {self.uri}: study {self.study_name!r} has no study run; "
                                    "the study driver creates it with start_study")
            self._study_run = run
        return self._study_run

    def has_study_run(self) -> bool:
        """Whether a study driver created the study run (an experiment made by hand has none)."""
        return self._study_run is not None or self._find_study_run() is not None

    @property
    def study_run_id(self) -> str:
        return self.study_run().info.run_id

    def finish_study(self, status: str = "FINISHED") -> None:
        """End the study run: FINISHED, or KILLED when the driver was interrupted."""
        if status not in ("FINISHED", "KILLED"):
            raise ValueError(f"status: expected FINISHED or KILLED, got {status!r}")
        self._call("ending the study run", self.client.set_terminated, self.study_run_id, status=status)

    # ---- trial, confirmation and baseline runs ----

    def find_trial_run(self, trial_number: int) -> Run | None:
        runs = self._search(f"{tag.where(tag.KIND, tag.TRIAL)} and {tag.where(tag.TRIAL_NUMBER, int(trial_number))}")
        return runs[0] if runs else None

    def running_trial_runs(self) -> list[Run]:
        """Trial runs still RUNNING: on resume, the ones a dead driver left behind."""
        return self._search(f"{tag.where(tag.KIND, tag.TRIAL)} and attributes.status = 'RUNNING'")

    def open_trial_run(self, trial_number: int, arch: Mapping[str, Any], train: Mapping[str, Any],
                       fingerprint: str, tags: Mapping[str, Any] | None = None, budget: Any = None) -> str:
        """The run of trial `trial_number` (`fingerprint`: its architecture's): created on the first
        call, the same run on every later one.

        `tags` uses short keys: controller and budget (the study's when absent), generation,
        parent_trial (its run id is looked up and set as `cramnas.parent_run_id`), mutation,
        repeat_of, rerun_of (the same: `cramnas.rerun_of_run_id`).
        """
        study = self.study_run()
        tags = dict(tags or {})
        tags.setdefault(attrs.CONTROLLER, study.data.tags.get(tag.CONTROLLER))
        if budget is None:
            budget = study.data.params.get("budget")
        for key, run_key in ((attrs.PARENT_TRIAL, tag.PARENT_RUN_ID), (attrs.RERUN_OF, tag.RERUN_OF_RUN_ID)):
            if tags.get(key) is not None:
                linked = self.find_trial_run(int(tags[key]))
                # An unknown parent (say, a seed imported from another study) keeps only its number.
                tags[run_key] = linked.info.run_id if linked else None
        run_tags = {**tag.as_tags(tags), tag.KIND: tag.TRIAL, tag.TRIAL_NUMBER: str(int(trial_number)),
                    tag.FINGERPRINT: fingerprint, tag.PARENT_RUN: study.info.run_id}
        return self._open_run(f"the run of trial {trial_number}", lambda: self.find_trial_run(trial_number),
                              run_tags, tag.trial_run_name(trial_number, arch, fingerprint), trial_params(arch, train, budget))

    def _find_seed_run(self, kind: str, key: str, value: str, seed: int, budget: str) -> Run | None:
        """The `kind` run tagged `key` = `value` that trained with `seed` under `budget`."""
        runs = self._search(" and ".join([tag.where(tag.KIND, kind), tag.where(key, value),
                                          tag.where(tag.SEED, int(seed)), tag.where(tag.BUDGET, budget)]))
        return runs[0] if runs else None

    def _seed_run_tags(self, kind: str, seed: int, budget: str, fingerprint: str | None) -> dict[str, str]:
        return {tag.KIND: kind, tag.SEED: str(int(seed)), tag.BUDGET: budget,
                tag.PARENT_RUN: self.study_run().info.run_id, **tag.as_tags({tag.FINGERPRINT: fingerprint})}

    def find_confirmation_run(self, original_run_id: str, seed: int, budget: str) -> Run | None:
        """The run that re-trained trial run `original_run_id` with `seed` under `budget`, if any."""
        return self._find_seed_run(tag.CONFIRMATION, tag.CONFIRMATION_OF, original_run_id, seed, budget)

    def open_confirmation_run(self, original_run_id: str, trial_number: int, seed: int, index: int,
                              arch: Mapping[str, Any], train: Mapping[str, Any], budget: str,
                              fingerprint: str | None = None) -> str:
        """The run re-training trial `trial_number`'s architecture (its run `original_run_id`) with
        `seed` under `budget`: nested under the study run, named `confirm-t0007-s1` (`index` = 1),
        tagged `cramnas.kind=confirmation`, `confirmation_of`, `original_trial`, `seed`, `budget`
        and `fingerprint`, with the params of a trial run. Its results go through `finish_run`.
        """
        run_tags = {**self._seed_run_tags(tag.CONFIRMATION, seed, budget, fingerprint),
                    tag.CONFIRMATION_OF: original_run_id, tag.ORIGINAL_TRIAL: str(int(trial_number))}
        return self._open_run(f"the confirmation of trial {trial_number} with seed {seed}",
                              lambda: self.find_confirmation_run(original_run_id, seed, budget),
                              run_tags, f"confirm-t{int(trial_number):04d}-s{int(index)}",
                              trial_params(arch, train, budget))

    def find_baseline_run(self, name: str, seed: int, budget: str) -> Run | None:
        """The run that trained hand-designed config `name` with `seed` under `budget`, if any."""
        return self._find_seed_run(tag.BASELINE, tag.BASELINE_NAME, name, seed, budget)

    def open_baseline_run(self, name: str, seed: int, index: int, arch: Mapping[str, Any],
                          train: Mapping[str, Any], budget: str, fingerprint: str | None = None) -> str:
        """The run training hand-designed config `name` (trainer/configs/<name>.yaml) with `seed`
        under `budget`, beside the confirmations: nested under the study run, named
        `<name> s1` (`index` = 1), tagged `cramnas.kind=baseline`, `baseline`, `seed`,
        `budget` and `fingerprint`, with the params of a trial run. Its results go through `finish_run`.
        """
        run_tags = {**self._seed_run_tags(tag.BASELINE, seed, budget, fingerprint), tag.BASELINE_NAME: name}
        return self._open_run(f"baseline {name} with seed {seed}", lambda: self.find_baseline_run(name, seed, budget),
                              run_tags, f"{name} s{int(index)}", trial_params(arch, train, budget))

    def _open_run(self, what: str, find: Callable[[], Run | None], tags: dict[str, str], run_name: str,
                  params: dict[str, str]) -> str:
        """Find the run `find` looks up, or create it with `tags` (which must let `find` find it);
        a found run that had been killed or failed is reopened: it is being run again."""
        def find_or_create() -> tuple[Run, bool]:
            run = find()
            if run is not None:
                return run, False
            # One retried unit, the lookup tags set with the run itself: a retry after a lost
            # "created" reply finds the run, and the run can never exist unfindable.
            return self.client.create_run(self.experiment_id(), tags={**tags, tag.STATE: RUNNING},
                                          run_name=run_name), True

        run, created = self._call(f"starting {what}", find_or_create)
        run_id = run.info.run_id
        if not created and run.info.status in ("KILLED", "FAILED"):
            self._call(f"reopening {what}", self.client.update_run, run_id, status="RUNNING")
            if tag.FAILURE_REASON in run.data.tags:
                self._call("clearing the failure reason", self.client.delete_tag, run_id, tag.FAILURE_REASON)
            tags = {**tags, tag.STATE: RUNNING}
        # Params are write-once: logging the same values again is a no-op, different ones an error
        # (a caller mixing up trial numbers), which surfaces as TrackingError.
        self._log_batch(f"logging {what}'s settings", run_id, params=params, tags=tags)
        return run_id

    def log_progress(self, run_id: str, step_tokens: int, metrics: Mapping[str, Any],
                     timestamp_ms: int | None = None) -> None:
        """One progress report (`train_loss`, `tokens_per_s`, `budget_fraction`, ...) at step = tokens seen.

        `timestamp_ms` (default: now) is fixed by a caller that may send the report again
        (`PendingWrites`): MLflow drops a metric point identical to one it has, so a repeat after a
        lost reply adds nothing."""
        timestamp = _now_ms() if timestamp_ms is None else timestamp_ms
        batch = [Metric(name, value, timestamp, int(step_tokens)) for name, value in _numbers(metrics).items()]
        self._log_batch("logging progress", run_id, metrics=batch)

    def finish_run(self, run_id: str, state: str, metrics: Mapping[str, Any] | None = None, *,
                   reason: str | None = None, tags: Mapping[str, Any] | None = None,
                   artifacts: Mapping[str, str | dict] | None = None, loss_curve: Sequence[tuple[int, float]] = (),
                   timestamp_ms: int | None = None, cut_short: bool = False) -> None:
        """Final metrics, loss curve, state and artifacts of a trial or confirmation run; then end it
        with the state's MLflow status (`search.base.states`; `cut_short`: the status of a run that the
        driver's death or Ctrl-C cut short).

        `metrics` may nest (`{"glue": {"sst2": {"accuracy": 0.8}}}` -> `glue.sst2.accuracy`);
        `search.study.report.trial_metrics` builds them from the trial's results. They are logged at step =
        `tokens` (the trial's last step) so that `tokens_per_s` ends where its progress series ends.
        `loss_curve` points already logged by `log_progress` are not logged twice. `reason` is the
        `cramnas.failure_reason`; `tags` any other tag (`search.base.tags`, or a short key:
        `search.base.tags.as_tags`). `artifacts` maps a file name to text or a dict, written as YAML or
        JSON by its extension: by convention `arch.yaml` (the arch dict) and `result.json`.
        `timestamp_ms`: see `log_progress`; every step here may be repeated without duplicating anything.
        """
        if state not in STATES or state == RUNNING:
            raise ValueError(f"state: expected one of {', '.join(s for s in STATES if s != RUNNING)}, got {state!r}")
        row = STATES[state]
        status = row.cut_short_status if cut_short and row.cut_short_status else row.run_status
        final = _numbers(metrics or {})
        step = int(final.get("tokens", 0))
        timestamp = _now_ms() if timestamp_ms is None else timestamp_ms
        batch = [Metric(name, value, timestamp, step) for name, value in final.items()]
        if loss_curve:
            logged = {m.step for m in self._call("reading the loss curve", self.client.get_metric_history,
                                                 run_id, "train_loss")}
            batch += [Metric("train_loss", float(loss), timestamp, int(tokens))
                      for tokens, loss in loss_curve if int(tokens) not in logged]
        # The regime (trainer/references.py) as a tag too: the MLflow UI filters runs by it.
        run_tags = {**tag.as_tags({**(tags or {}), tag.FAILURE_REASON: reason, tag.REGIME: regime_of(final)}), tag.STATE: state}
        self._log_batch("logging the run's results", run_id, metrics=batch, tags=run_tags)
        for name, content in (artifacts or {}).items():
            if isinstance(content, str):
                self._call(f"writing {name}", self.client.log_text, run_id, content, name)
            else:
                self._call(f"writing {name}", self.client.log_dict, run_id, content, name)
        self._call("ending the run", self.client.set_terminated, run_id, status=status)

    def read_artifact(self, run_id: str, name: str) -> Any:
        """A run's artifact as `finish_run` wrote it: `*.yaml`/`*.json` parsed, other files as
        text; None when the run has no such artifact."""
        if name not in {item.path for item in self._call("listing artifacts", self.client.list_artifacts, run_id)}:
            return None
        with tempfile.TemporaryDirectory() as tmp:
            text = Path(self._call(f"reading {name}", self.client.download_artifacts, run_id, name, tmp)).read_text()
        if name.endswith(".json"):
            return json.loads(text)
        return yaml.safe_load(text) if name.endswith((".yaml", ".yml")) else text

    def log_hf_export(self, run_id: str, checkpoint: str) -> str | None:
        """Log `checkpoint`'s Hugging Face export (`trainer.export_hf`) as the run's `hf_model/`
        artifact: None when logged, else why not. A checkpoint that cannot be exported costs its
        run the export, not the result, so the caller records the reason and the run stays as it
        is; an unreachable store raises `TrackingUnavailable` like any write, so it is held and retried."""
        from trainer.export_hf import log_to_mlflow  # torch and transformers: only for studies that save checkpoints

        try:
            self._call("logging the Hugging Face export", log_to_mlflow, self.client, run_id, checkpoint)
        except TrackingUnavailable:
            raise
        except Exception as error:  # noqa: BLE001 - any failure is the export's, reported by the caller
            return f"{type(error).__name__}: {first_line(error)}"
        return None

    # ---- reading back ----

    def trial_table(self) -> pd.DataFrame:
        """One row per trial run, by trial number: `run_id`, `run_name`, `trial`, `status` (MLflow's),
        `start_time`, `end_time` and `params.*`, `metrics.*` (latest value), `tags.*` columns."""
        rows = [{"trial": int(run.data.tags[tag.TRIAL_NUMBER]), **_run_row(run)}
                for run in self._search(tag.where(tag.KIND, tag.TRIAL))]
        if not rows:
            return pd.DataFrame(columns=["run_id", "run_name", "trial", "status", "start_time", "end_time"])
        return pd.DataFrame(rows).sort_values("trial", ignore_index=True)

    def confirmation_table(self) -> pd.DataFrame:
        """One row per confirmation run (`search.confirm`), oldest first, with the columns of
        `trial_table` (its `trial` is the original trial's number, from `cramnas.original_trial`)."""
        return self._kind_table(tag.CONFIRMATION, "trial", lambda tags: int(tags.get(tag.ORIGINAL_TRIAL, -1)))

    def baseline_table(self) -> pd.DataFrame:
        """One row per baseline run (`search.confirm --baselines`), oldest first, with the columns
        of `trial_table` but `trial`: `baseline` is the config's name (`cramnas.baseline`)."""
        return self._kind_table(tag.BASELINE, "baseline", lambda tags: tags.get(tag.BASELINE_NAME, ""))

    def _kind_table(self, kind: str, column: str, value: Callable[[dict[str, str]], Any]) -> pd.DataFrame:
        rows = [{column: value(run.data.tags), **_run_row(run)} for run in self._search(tag.where(tag.KIND, kind))]
        if not rows:
            return pd.DataFrame(columns=["run_id", "run_name", column, "status", "start_time", "end_time"])
        return pd.DataFrame(rows)

    def top_trial_runs(self, objective: Objective, k: int = 1) -> list[dict[str, Any]]:
        """The `k` best complete trials by the objective's ranking metric, best first (a tie: the
        earlier trial first), as rows of `trial_table`; fewer when fewer complete trials have it.
        Pruned trials stopped early and repeats copy an earlier result, so neither competes."""
        frame = self.trial_table()
        column = f"metrics.{objective.rank_metric}"
        state = tag.column(tag.STATE)
        if column not in frame or state not in frame:
            return []
        # A diverged trial's NaN loss, or a metric it never logged (NaN in the frame), never wins.
        candidates = frame[(frame[state] == COMPLETE) & frame[column].map(math.isfinite)]
        ranked = candidates.sort_values(column, ascending=not objective.higher_is_better, kind="stable")
        return ranked.head(k).to_dict("records")


def _run_row(run: Run) -> dict[str, Any]:
    """A run as a flat row: `run_id`, `run_name`, `status` (MLflow's), `start_time`, `end_time`,
    `params.*`, `metrics.*` (latest value) and `tags.*`."""
    return {
        "run_id": run.info.run_id,
        "run_name": run.info.run_name,
        "status": run.info.status,
        "start_time": pd.to_datetime(run.info.start_time, unit="ms", utc=True),
        "end_time": pd.to_datetime(run.info.end_time, unit="ms", utc=True),
        **{f"params.{k}": v for k, v in run.data.params.items()},
        **{f"metrics.{k}": v for k, v in run.data.metrics.items()},
        **{f"tags.{k}": v for k, v in run.data.tags.items()},
    }

