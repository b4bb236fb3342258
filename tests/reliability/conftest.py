"""Fixtures of the fault-injection suite: an MLflow tracking server that a test can stop and start
again on the same port. (Ray on loopback, the data slice and its token cache: tests/conftest.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import free_port


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
