"""Plain helpers shared by the tests (fixtures live in the conftest.py files): where the real data is,
the size of its test slice, a free port, a subprocess environment, a fake clock, a tiny checkpoint,
a run config shrunk to the slice, and an MLflow tracking server that a test can stop and start.

Studies have their own helper modules: `tests/studies.py` (real tiny studies through `search.run`)
and `tests/dashboard_study.py` (a synthetic study written straight to the stores)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "trainer" / "configs"
SHARED_DATA = ROOT.parent / "shared" / "data"
WIKI = SHARED_DATA / "pretrain" / "wikipedia_en_2015"

requires_shared_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"no shared data at {SHARED_DATA}")

# A slice of the shared Wikipedia small enough to prepare in seconds: real text, tiny vocabulary.
SLICE_TRAIN_ARTICLES, SLICE_VALIDATION_ARTICLES = 400, 40
SLICE_VOCAB, SLICE_SEQ = 2048, 64


def prepare_slice(data_dir: Path, cache: Path):
    """The slice in `data_dir` prepared as the tiny space wants it (read from `cache` when there)."""
    from trainer.corpus import CorpusSource
    from trainer.data import prepare_data

    return prepare_data(CorpusSource.from_args(data_dir=str(data_dir)), vocab_size=SLICE_VOCAB, seq_len=SLICE_SEQ,
                        cache_dir=cache)


def slice_config(tmp_path: Path, **train) -> Path:
    """crammed-bert-cpu shrunk to the test slice's vocabulary and sequence length, written to
    tmp_path/slice.yaml; `train` overrides training settings."""
    config = yaml.safe_load((CONFIGS / "crammed-bert-cpu.yaml").read_text())
    config["arch"].update(layers=2, hidden=64, heads=4, vocab_size=SLICE_VOCAB, max_seq_len=SLICE_SEQ)
    config["train"].update(micro_batch=8, batch_size=16, **train)
    path = tmp_path / "slice.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def cli_env(**extra: str) -> dict[str, str]:
    """The environment for a cramnas command (or `ray start`) run in a subprocess: this checkout
    importable, the hub offline, Ray on loopback without auth, and no store or fault setting of the
    caller's environment leaking in; `extra` adds or overrides variables. Start the command with
    `sys.executable`, the interpreter running the tests, never `python` from PATH."""
    env = {key: value for key, value in os.environ.items()
           if key not in ("MLFLOW_TRACKING_URI", "CRAMNAS_STUDY_STORAGE", "CRAMNAS_INJECT_FAULT")}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               RAY_AUTH_MODE="disabled", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.update(extra)
    return env


class FakeTime:
    """A clock and a sleep for code that takes them as arguments: sleeping advances the clock at once,
    and so does `advance` (a test's stand-in for work that takes time)."""

    def __init__(self) -> None:
        self.now, self.sleeps = 0.0, []

    def clock(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def tiny_checkpoint(root: Path, extra_vocab: int = 0) -> Path:
    """A real checkpoint (`trainer.checkpoint.save_checkpoint`, as trainer.cram writes it) of a
    1-layer model in root/checkpoint, with a WordPiece tokenizer of 96 tokens; `extra_vocab` gives
    the model that many more tokens than its tokenizer."""
    from space.arch import ArchConfig
    from trainer.checkpoint import save_checkpoint
    from trainer.config import TrainConfig
    from trainer.model import CrammedBert
    from trainer.tokenizer import train_wordpiece

    tokenizer = train_wordpiece(["a small cat sleeps on the warm mat and dreams of fish, milk and quiet afternoons"] * 20,
                                vocab_size=96, normalization="cramming")
    tokenizer.save(str(root / "tokenizer.json"))
    arch = ArchConfig(layers=1, hidden=32, heads=2, vocab_size=tokenizer.get_vocab_size() + extra_vocab, max_seq_len=64)
    return save_checkpoint(root / "checkpoint", CrammedBert(arch), arch, TrainConfig(), root / "tokenizer.json", {})


class TrackingServer:
    """`mlflow server` on 127.0.0.1 over a SQLite file, in its own process group (docs/stack.md: one
    worker and no job execution keep it near 500 MiB; /health answers after 8-17 s)."""

    def __init__(self, root: Path):
        self.root, self.port = root, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.log = root / "mlflow-server.log"

    def start(self, timeout_s: float = 90) -> None:
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.root}/mlflow-server.db",
                 "--artifacts-destination", str(self.root / "mlflow-artifacts"), "--host", "127.0.0.1",
                 "--port", str(self.port), "--workers", "1"],
                cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"mlflow server exited with {self.process.returncode}: {self.log.read_text()[-2000:]}")
            try:
                if requests.get(f"{self.uri}/health", timeout=2).ok:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        pytest.fail(f"mlflow server gave no /health in {timeout_s} s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        """SIGTERM the server's process group (it ends its workers in 3-5 s), SIGKILL if it lingers."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


class CountingBackend:
    """A torch.compile backend that runs graphs as they are and counts them."""

    def __init__(self, on_compile=None) -> None:
        self.graphs, self.on_compile = 0, on_compile

    def __call__(self, graph_module, example_inputs):
        self.graphs += 1
        if self.on_compile is not None:
            self.on_compile()
        return graph_module.forward


class Watch:
    """An instrument that records only inside `with watch.watching():` (its `active` flag): the calls
    of one stretch of a run, not of its set-up."""

    active = False

    @contextlib.contextmanager
    def watching(self):
        self.active = True
        try:
            yield
        finally:
            self.active = False


def table(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the Markdown table whose header row starts with `header`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows
