"""The bad-input battery (issue 7 §2): each CLI run as a user runs it, given one malformed input.

Every case runs the real command in a subprocess, in an empty working directory, and must end with
exit code 2, no traceback, exactly one `error:` line that names the problem and the fix, and
before any work, so without side effects: no data prepared, no `runs/` checkpoint, no MLflow run
and no Optuna trial or study created (search.run may open its two stores before it reads the data;
nothing else may write a file there). How long a case takes is not asserted: it depends on the
machine's load.

These cases add the command-line view to the function-level tables, which they do not repeat:
tests/test_space_errors.py (the space grammar, ~50 mistakes), tests/test_cram_cli.py (missing
config or data dir, unknown keys, impossible architecture, unwritable --out), tests/test_search.py
(--trials 0, --resume without --study, unknown study on --resume, 5 fortnights, --no-probe with a
probe objective, an existing study without --resume), tests/test_data.py (corpus layouts, the
hub offline) and tests/test_glue.py (unknown or absent GLUE tasks, wrong columns).
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.helpers import cli_env, tiny_checkpoint

REPO = Path(__file__).resolve().parents[2]
TINY_SPACE = REPO / "tests" / "search_files" / "tiny_space.yaml"
TINY_PROFILE = REPO / "tests" / "search_files" / "tiny_profile.yaml"
RUN_CONFIG = REPO / "trainer" / "configs" / "crammed-bert-cpu.yaml"
TEXT = ("the quick brown fox jumps over the lazy dog near the river bank while 12 birds sing; "
        "a small cat sleeps on the warm mat and dreams of fish, milk and quiet afternoons.")


class Inputs:
    """The files a case needs, written under `root/inputs` (the command runs in `root`)."""

    def __init__(self, root: Path, request: pytest.FixtureRequest):
        self.root, self.request = root, request
        self.dir = root / "inputs"
        self.dir.mkdir()

    def file(self, name: str, text: str) -> str:
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return str(path)

    def corpus(self, rows: int = 40) -> str:
        """A data directory DATA/pretrain/tiny/train.parquet of `rows` short documents, no GLUE."""
        folder = self.dir / "data" / "pretrain" / "tiny"
        folder.mkdir(parents=True, exist_ok=True)
        pd.DataFrame({"text": [f"{TEXT} document {i}." for i in range(rows)]}).to_parquet(folder / "train.parquet")
        return str(self.dir / "data")

    def space(self, params: str = "", constraints: str = "[]") -> str:
        """The tiny test space with parameter lines appended (YAML keeps the last of a repeated key)."""
        text = TINY_SPACE.read_text()
        assert text.rstrip().splitlines()[-1].startswith("  "), "tiny_space.yaml must end inside params"
        return self.file("space.yaml", f"{text.rstrip()}\n{params}constraints: {constraints}\n")

    def config(self, arch: dict | None = None, train: dict | None = None, top: dict | None = None) -> str:
        """crammed-bert-cpu shrunk to seconds of work, with the given changes."""
        config = yaml.safe_load(RUN_CONFIG.read_text())
        config["arch"].update({"layers": 1, "hidden": 32, "heads": 2, "vocab_size": 256, "max_seq_len": 64, **(arch or {})})
        config["train"].update({"micro_batch": 8, "batch_size": 16, **(train or {})})
        config.update(top or {})
        return self.file("run.yaml", yaml.safe_dump(config))

    def checkpoint(self, arch_yaml: dict | None = None, tokenizer_extra: int = 0) -> str:
        """A real checkpoint of a tiny model (the `tiny_checkpoints` fixture), then edited:
        `arch_yaml` rewrites arch.yaml's fields; `tokenizer_extra` > 0 makes the model's vocabulary
        larger than its tokenizer's."""
        source = self.request.getfixturevalue("tiny_checkpoints")[tokenizer_extra]
        target = self.dir / "checkpoint"
        target.mkdir()
        for file in source.iterdir():
            (target / file.name).write_bytes(file.read_bytes())
        if arch_yaml:
            arch = yaml.safe_load((target / "arch.yaml").read_text())
            (target / "arch.yaml").write_text(yaml.safe_dump({**arch, **arch_yaml}))
        return str(target)

    def study(self, complete: bool) -> str:
        """optuna.db in the working directory, holding one study of one trial, `done` (complete, as
        search.run records it) or `empty` (its only trial failed)."""
        import optuna

        from space.arch import ArchConfig
        from trainer.config import TrainConfig

        name = "done" if complete else "empty"
        study = optuna.create_study(study_name=name, storage=f"sqlite:///{self.root / 'optuna.db'}")
        study.set_user_attr("train", TrainConfig().to_dict())
        trial = study.ask()
        if not complete:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            return name
        trial.set_user_attr("arch", ArchConfig(layers=2, hidden=64, heads=2).to_dict())
        trial.set_user_attr("metrics", {"validation_loss": 3.5})
        study.tell(trial, 3.5)
        return name


@dataclass(frozen=True)
class Case:
    module: str
    args: Callable[[Inputs], list[str]]
    expect: tuple[str, ...]  # all in the one error line: the field, flag or path, and the fix


def run_args(*extra: str) -> Callable[[Inputs], list[str]]:
    """search.run with the tiny profile on a tiny corpus, without the probe, plus `extra`."""
    return lambda i: ["--profile", str(TINY_PROFILE), "--data", i.corpus(), "--no-probe", "--objective", "mlm",
                      *extra]


CASES = {
    # ---- python -m search.run: profile and search-space files --------------------------------------
    "run: profile without a space": Case(
        "search.run", lambda i: ["--profile", i.file("p.yaml", "budget: 60s\nrun_config: crammed-bert-cpu.yaml\n")],
        ("--profile", "p.yaml", "needs space", "cpu.yaml")),
    "run: profile YAML syntax error": Case(
        "search.run", lambda i: ["--profile", i.file("p.yaml", "space: [tiny.yaml\n")],
        ("--profile", "p.yaml", "not valid YAML", "line 2")),
    "run: space YAML syntax error": Case(
        "search.run", lambda i: run_args("--space", i.file("space.yaml", "name: s\nparams:\n  layers: {int: [1, 3]\n"))(i),
        ("space.yaml", "line 4", "YAML syntax error", "fix the YAML syntax")),
    "run: space unknown field": Case(
        "search.run", lambda i: run_args("--space", i.space("  hiden: {choice: [64]}\n"))(i),
        ("space.yaml", "params.hiden", "did you mean 'hidden'")),
    "run: space bad choice": Case(
        "search.run", lambda i: run_args("--space", i.space("  ffn_kind: {choice: [gelu, swiglo]}\n"))(i),
        ("params.ffn_kind.choice", "'swiglo'", "did you mean 'swiglu'")),
    "run: space empty choice list": Case(
        "search.run", lambda i: run_args("--space", i.space("  heads: {choice: []}\n"))(i),
        ("params.heads.choice", "non-empty list")),
    "run: space constraint names an unknown name": Case(
        "search.run", lambda i: run_args("--space", i.space(constraints='["param_millions < 3"]'))(i),
        ("constraints[0]", "param_millions", "did you mean 'params_millions'")),
    "run: space when: condition error": Case(
        "search.run", lambda i: run_args("--space", i.space("  qkv_bias: {bool, when: 'layers >'}\n"))(i),
        ("params.qkv_bias.when", "not a valid expression")),
    "run: space min above max": Case(
        "search.run", lambda i: run_args("--space", i.space("  layers: {int: [3, 1]}\n"))(i),
        ("params.layers.int", "low 3 is above high 1", "write [1, 3]")),
    # ---- python -m search.run: budget and flags ----------------------------------------------------
    "run: budget 0s": Case("search.run", run_args("--budget", "0s"), ("budget", "'0s'", "must be positive", "60s")),
    "run: budget abc": Case("search.run", run_args("--budget", "abc"), ("budget", "'abc'", "2e7tokens")),
    "run: --max-concurrent -1": Case("search.run", run_args("--max-concurrent", "-1"),
                                     ("--max-concurrent", "at least 1", "-1")),
    "run: unknown controller": Case("search.run", run_args("--controller", "tpee"),
                                    ("--controller", "'tpee'", "is not one of", "did you mean tpe?")),
    "run: --gpus-per-trial beyond this machine": Case(
        "search.run", run_args("--gpus-per-trial", "64"), ("--gpus-per-trial", "64 GPUs", "at most", "--address")),
    "run: --cpus-per-trial beyond this machine": Case(
        "search.run", run_args("--cpus-per-trial", "4096"), ("--cpus-per-trial", "4096 CPUs", "at most", "--address")),
    "run: --seed -1": Case("search.run", run_args("--seed", "-1"), ("--seed", "must not be negative", "-1")),
    "run: --storage with an unknown driver": Case(
        "search.run", run_args("--storage", "nosuch://study"), ("--storage", "nosuch://study", "sqlite:///optuna.db")),
    # ---- python -m search.run: data directories ----------------------------------------------------
    "run: missing data directory": Case(
        "search.run", lambda i: ["--profile", str(TINY_PROFILE), "--data", str(i.dir / "nowhere")],
        ("nowhere", "does not exist", "pretrain/<name>/train.parquet")),
    "run: data directory without a pretrain corpus": Case(
        "search.run", lambda i: ["--profile", str(TINY_PROFILE), "--data", str(Path(i.file("data/README", "")).parent)],
        ("no recognisable corpus", "expected pretrain/<name>/train.parquet")),
    "run: empty parquet": Case(
        "search.run", lambda i: ["--profile", str(TINY_PROFILE), "--data", i.corpus(rows=0)],
        ("train.parquet", "has no rows", "write the corpus into it")),
    "run: GLUE task of the probe missing": Case(
        "search.run", lambda i: ["--profile", str(TINY_PROFILE), "--data", i.corpus()],
        ("--data", "GLUE task rte", "probe.tasks", "--no-probe --objective mlm")),
    # ---- python -m trainer.cram: run configs, budgets, data ----------------------------------------
    "cram: config is a YAML list": Case("trainer.cram", lambda i: ["--config", i.file("list.yaml", "- layers: 2\n")],
                                        ("list.yaml", "expected a mapping", "name, arch and train")),
    "cram: config YAML syntax error": Case("trainer.cram", lambda i: ["--config", i.file("bad.yaml", "name: [x\n")],
                                           ("bad.yaml", "not valid YAML")),
    "cram: negative lr": Case("trainer.cram", lambda i: ["--config", i.config(train={"lr": -0.001})],
                              ("run.yaml: train.lr", "must be positive", "-0.001")),
    "cram: micro_batch 0": Case("trainer.cram", lambda i: ["--config", i.config(train={"micro_batch": 0})],
                                ("run.yaml: train.micro_batch", "must be positive")),
    "cram: lr written 1e-3 (YAML text)": Case("trainer.cram", lambda i: ["--config", i.config(train={"lr": "1e-3"})],
                                              ("run.yaml: train.lr", "got '1e-3'", "write 1.0e-3")),
    "cram: betas a single number": Case("trainer.cram", lambda i: ["--config", i.config(train={"betas": 0.9})],
                                        ("train.betas", "two numbers", "[0.9, 0.98]")),
    "cram: betas outside [0, 1)": Case("trainer.cram", lambda i: ["--config", i.config(train={"betas": [0.9, 1.5]})],
                                       ("run.yaml: train.betas", "[0, 1)", "1.5")),
    "cram: --seed -1": Case("trainer.cram", lambda i: ["--config", i.config(), "--seed=-1"],
                            ("train.seed", "must not be negative", "-1")),
    "cram: train a list": Case("trainer.cram", lambda i: ["--config", i.config(top={"train": [1, 2]})],
                               ("run.yaml: train", "expected a mapping", "trainer/configs/")),
    "cram: vocab_size below the corpus alphabet": Case(
        "trainer.cram", lambda i: ["--config", i.config(arch={"vocab_size": 16}), "--data", i.corpus()],
        ("vocab_size=16", "corpus alphabet", "use vocab_size >=")),
    "cram: budget 1e3 without a unit": Case("trainer.cram", lambda i: ["--config", i.config(), "--budget", "1e3"],
                                            ("budget", "'1e3'", "no unit", "1e3tokens")),
    "cram: budget -5m": Case("trainer.cram", lambda i: ["--config", i.config(), "--budget=-5m"],
                             ("budget", "'-5m'", "must be positive")),
    "cram: cache directory below a file": Case(
        "trainer.cram", lambda i: ["--config", i.config(), "--data", i.corpus(),
                                   "--cache-dir", str(Path(i.file("a_file", "")) / "cache")],
        ("cache directory", "a_file/cache", "--cache-dir", "CRAMNAS_CACHE")),
    # ---- python -m glue.evaluate: checkpoints and flags --------------------------------------------
    "evaluate: tokenizer of another vocabulary": Case(
        "glue.evaluate", lambda i: ["--checkpoint", i.checkpoint(tokenizer_extra=8), "--data", i.dir],
        ("tokenizer.json", "tokens but the model's vocab_size is", "restore the tokenizer.json")),
    "evaluate: impossible arch.yaml": Case(
        "glue.evaluate", lambda i: ["--checkpoint", i.checkpoint(arch_yaml={"heads": 5}), "--data", i.dir],
        ("arch.yaml", "heads", "restore the arch.yaml")),
    "evaluate: weights of another shape than arch.yaml": Case(
        "glue.evaluate", lambda i: ["--checkpoint", i.checkpoint(arch_yaml={"hidden": 64}), "--data", i.dir],
        ("model.safetensors", "size mismatch", "written by trainer.cram")),
    "evaluate: GLUE task missing from --data": Case(
        "glue.evaluate", lambda i: ["--checkpoint", i.checkpoint(), "--tasks", "mnli", "--data", i.dir],
        ("task mnli", "missing", "--tasks available")),
    "evaluate: --max-seconds-per-task 0": Case(
        "glue.evaluate", lambda i: ["--checkpoint", i.checkpoint(), "--protocol", "probe",
                                    "--max-seconds-per-task", "0"],
        ("--max-seconds-per-task", "must be positive")),
    # ---- python -m search.export ------------------------------------------------------------------
    "export: study store does not exist": Case("search.export", lambda i: ["--study", "nobody"],
                                               ("--study", "no study store", "optuna.db", "--tracking-uri")),
    "export: no completed trial": Case("search.export", lambda i: ["--study", i.study(complete=False)],
                                       ("study empty", "no completed trial", "--rank-by mlm")),
    "export: MLflow store that does not exist": Case(
        "search.export", lambda i: ["--study", i.study(complete=True), "--rank-by", "mlm",
                                    "--storage", f"sqlite:///{i.root / 'optuna.db'}",
                                    "--tracking-uri", f"sqlite:///{i.dir / 'elsewhere' / 'mlflow.db'}",
                                    "--out", str(i.root / "best.yaml"), "--force"],
        ("--tracking-uri", "no MLflow store", "elsewhere/mlflow.db", "the search used")),
    # ---- python -m search.confirm -----------------------------------------------------------------
    "confirm: --top 0": Case("search.confirm", lambda i: ["--study", "s", "--top", "0"], ("--top", "at least 1")),
    "confirm: no MLflow store": Case("search.confirm", lambda i: ["--study", "s"],
                                     ("--tracking-uri", "no MLflow store", "mlflow.db")),
}


@pytest.fixture(scope="module")
def tiny_checkpoints(tmp_path_factory) -> dict[int, Path]:
    """{0: a consistent checkpoint of a 1-layer model, 8: one whose arch.yaml and weights have 8 more
    tokens than its tokenizer.json} (tests/helpers.py's `tiny_checkpoint`)."""
    return {extra: tiny_checkpoint(tmp_path_factory.mktemp(f"extra{extra}"), extra) for extra in (0, 8)}


@pytest.fixture(scope="module")
def command_env(tmp_path_factory) -> dict[str, str]:
    return cli_env(CRAMNAS_CACHE=str(tmp_path_factory.mktemp("cache")))


def store_counts(directory: Path) -> dict[str, int]:
    """Rows of the tables that record trials, in the working directory's MLflow and Optuna stores."""
    counts = {}
    for database, tables in (("mlflow.db", ("runs",)), ("optuna.db", ("studies", "trials"))):
        if (directory / database).is_file():
            with sqlite3.connect(directory / database) as connection:
                present = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'")}
                for table in tables:
                    if table in present:
                        counts[f"{database}:{table}"] = connection.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    return counts


def prepared(cache: Path) -> set[Path]:
    """What preparation leaves in the token cache: trained tokenizers and packed data. (Loading a
    corpus also leaves `datasets`' Arrow copy under hf-datasets/: a vocabulary smaller than the
    corpus alphabet can only be found by reading the corpus.)"""
    return {path for kind in ("tokenizers", "data") for path in (cache / kind).glob("*")}


@pytest.mark.parametrize("name", CASES)
@pytest.mark.slow
@pytest.mark.subprocess
def test_bad_input_is_one_line_before_any_work(name, tmp_path, request, command_env):
    case = CASES[name]
    inputs = Inputs(tmp_path, request)
    args = case.args(inputs)
    before = set(tmp_path.iterdir())
    counts = store_counts(tmp_path)
    cache = Path(command_env["CRAMNAS_CACHE"])
    cached = prepared(cache)
    result = subprocess.run([sys.executable, "-m", case.module, *map(str, args)], cwd=tmp_path, env=command_env,
                            capture_output=True, text=True, timeout=300, check=False)
    output = result.stdout + result.stderr

    assert result.returncode == 2, output
    assert "Traceback" not in output, output
    errors = [line for line in output.splitlines() if "error:" in line]
    assert len(errors) == 1, output
    missing = [text for text in case.expect if text not in errors[0]]
    assert not missing, f"{missing} not in: {errors[0]}"
    # Nothing prepared, trained or recorded: no token cache, no checkpoint, no run, no trial, no study.
    assert prepared(cache) == cached, "data was prepared before the error"
    created = {path.name for path in set(tmp_path.iterdir()) - before}
    allowed = {"mlflow.db", "optuna.db"} if case.module == "search.run" else set()
    assert created <= allowed, created
    after = store_counts(tmp_path)
    assert all(after.get(table, 0) == counts.get(table, 0) for table in ("mlflow.db:runs", "optuna.db:studies",
                                                                         "optuna.db:trials")), (counts, after)
