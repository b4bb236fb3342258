"""The commands that come after a study, spelled out with the flags the study used.

`search.run` ends by naming the report, the MLflow UI, `search.confirm` and `search.export`;
`search.confirm` names the report and the export; `search.export` the `trainer.cram` run of the
winner; the study report its own next commands. A command that must read the data again (confirm,
cram) gets the study's `--data`, `--corpus` and `--cache-dir`, which the study run records for the
purpose (`DATA_SETTINGS`); a command that reads the stores gets `--tracking-uri` and `--storage`
unless they are the defaults it would use anyway.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from search.base import tags as tag

if TYPE_CHECKING:
    from mlflow.entities import Run

    from search.study.spec import StudyPlan

# Study settings (study-run tags `cramnas.<key>`) naming where the study's data came from, and
# the flag that passes each again.
DATA_SETTINGS = {"data": "--data", "corpus": "--corpus", "cache_dir": "--cache-dir"}


def baselines(device: str) -> str:
    """The hand-designed configs (trainer/configs/) to confirm a study against: its profile's warm
    starts (search/profiles/<device>.yaml), the designs a careful person would pick today at that
    scale (Cramming's, NeoBERT's, ModernBERT's and, on a CPU, crammed-bert with RoPE at the best size
    for the budget); the GPU configs do not fit a CPU."""
    from search.study.warm_start import hand_design_names

    return ",".join(hand_design_names(device))


def data_settings(data_dir: str | None, corpus: str | None, cache_dir: str | None) -> dict[str, str]:
    """What the study run records of the study's data (`DATA_SETTINGS`): only what was given."""
    given = {"data": data_dir, "corpus": corpus, "cache_dir": cache_dir}
    return {key: value for key, value in given.items() if value}


def report_path(study: str) -> str:
    """The report's default file: one per study, so the next study's report does not overwrite it."""
    return f"report-{re.sub(r'[^A-Za-z0-9._-]+', '_', study)}.html"


@dataclass(frozen=True)
class StudyFlags:
    """What a later command needs to find the study and its data again."""

    study: str
    tracking_uri: str | None = None
    storage: str | None = None
    data: Mapping[str, str] | None = None  # `data_settings`

    @classmethod
    def of_run(cls, study: str, tracking_uri: str | None, study_run: Run | None,
               storage: str | None = None) -> StudyFlags:
        """The flags of a study whose study run recorded its data settings (none when it did not)."""
        tags = study_run.data.tags if study_run is not None else {}
        recorded = {key: tags[tag.named(key)] for key in DATA_SETTINGS if tags.get(tag.named(key))}
        return cls(study, tracking_uri, storage, recorded)

    def store_flags(self, storage: bool = True) -> list[str]:
        """`--tracking-uri` and (`storage`: for a command that takes it) `--storage`, each only
        when it is not what the command would default to, here."""
        from search.tracking.stores import resolve_uri, study_storage  # MLflow: seconds, only for the hint itself

        flags = []
        uri = resolve_uri(self.tracking_uri) if self.tracking_uri else None
        if uri is not None and uri != resolve_uri(None):
            flags += ["--tracking-uri", uri]
        if storage and self.storage and self.storage != study_storage(uri):
            flags += ["--storage", self.storage]
        return flags

    def data_flags(self) -> list[str]:
        data = self.data or {}
        return [part for key, flag in DATA_SETTINGS.items() if data.get(key) for part in (flag, data[key])]

    def _command(self, module: str, *flags: str) -> str:
        return shlex.join(["python", "-m", module, *flags])

    def report(self) -> str:
        return self._command("dashboards.report", "--study", self.study, *self.store_flags())

    def ui(self) -> str:
        return self._command("dashboards.ui", "--study", self.study, *self.store_flags(storage=False))

    def confirm(self, *extra: str) -> str:
        return self._command("search.confirm", "--study", self.study, *self.store_flags(storage=False),
                             *self.data_flags(), *extra)

    def export(self) -> str:
        return self._command("search.export", "--study", self.study, *self.store_flags())

    def cram(self, config: str, budget: str) -> str:
        return self._command("trainer.cram", "--config", config, "--budget", budget, *self.data_flags())


def next_steps(pairs: list[tuple[str, str]]) -> str:
    """`next steps:` and one aligned `what:  command` line per pair."""
    width = max(len(what) for what, _ in pairs) + 2
    return "\n".join(["next steps:", *(f"  {what + ':':<{width}}{command}" for what, command in pairs)])


def after_search(plan: StudyPlan) -> str:
    """The commands that follow a finished `search.run`, with the flags this study used."""
    flags = StudyFlags(plan.study, plan.tracking_uri, plan.storage,
                       data_settings(plan.template.data_dir, plan.template.corpus, plan.template.cache_dir))
    device = "gpu" if plan.resources.get("gpu", 0) > 0 else "cpu"
    return next_steps([("report", f"{flags.report()}   # writes {report_path(plan.study)}"),
                       ("MLflow UI", flags.ui()),
                       ("confirm", flags.confirm("--baselines", baselines(device))),
                       ("export", f"{flags.export()}   # the best confirmed trial, once confirmed")])


def print_after_search(plan: StudyPlan, code: int) -> int:
    """Print `after_search` when the study finished (exit code 0); pass the exit code on."""
    if code == 0:
        print(after_search(plan))
    return code
