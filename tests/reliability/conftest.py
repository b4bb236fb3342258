"""Fixtures of the fault-injection suite: Ray kept on loopback, the data slice prepared once for
every study, and an MLflow tracking server that a test can stop and start again on the same port."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import SLICE_SEQ, SLICE_VOCAB


@pytest.fixture(autouse=True)
def loopback_ray(monkeypatch):
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture(scope="session")
def slice_cache(wiki_slice_dir, tmp_path_factory) -> Path:
    """A token cache holding the Wikipedia slice as the tiny space wants it (vocab 2048, sequences
    of 64): every study and CLI run of the suite reads it instead of preparing the slice again."""
    from trainer.data import CorpusSource, prepare_data

    cache = tmp_path_factory.mktemp("slice-cache")
    prepare_data(CorpusSource.from_args(data_dir=str(wiki_slice_dir)), vocab_size=SLICE_VOCAB, seq_len=SLICE_SEQ,
                 cache_dir=cache)
    return cache


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class TrackingServer:
    """`mlflow server` on 127.0.0.1 over a SQLite file, in its own process group (STACK.md: one
    worker and no job execution keep it near 500 MiB; /health answers after 8-17 s)."""

    def __init__(self, root: Path):
        self.root, self.port = root, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.log = root / "mlflow-server.log"

    def start(self, timeout_s: float = 90) -> None:
        mlflow_bin = Path(sys.executable).with_name("mlflow")
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with open(self.log, "a") as log:
            self.process = subprocess.Popen(
                [str(mlflow_bin), "server", "--backend-store-uri", f"sqlite:///{self.root}/mlflow-server.db",
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


@pytest.fixture
def tracking_server(tmp_path):
    server = TrackingServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
