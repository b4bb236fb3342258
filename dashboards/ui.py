"""`python -m dashboards.ui --study NAME`: the MLflow UI over a study's tracking store.

Starts `mlflow server` on 127.0.0.1 (`--host` to open it wider, explicitly), lean: one worker and
no job runner (docs/stack.md: about 485 MiB instead of 3.1 GB), waits until it answers `/health`, then
prints the URL of the study's runs table and a compare view of its top 5 trials, and serves until
Ctrl-C or SIGTERM. `serve` and `study_urls` are the same pieces for scripts (screenshots, tests):

    with serve("sqlite:////data/mlflow.db", port=5055) as server:
        urls = study_urls("sqlite:////data/mlflow.db", "s1", server.url)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import requests

from dashboards.analysis import top_k
from dashboards.data import StudyData, load_study, open_store
from dashboards.page import plural
from search.base.states import STATES
from space.errors import CramnasError, UsageError
from trainer.console import CliParser

DEFAULT_PORT = 5000
LOOPBACK = "127.0.0.1"
HEALTH_TIMEOUT_S = 120.0  # measured 8-17 s on an idle 2-core machine; a loaded one is slower


# ---- URLs ---------------------------------------------------------------------------------------

# MLflow 3 opens experiments, runs and comparisons in its GenAI (traces) view unless told otherwise.
ML_VIEW = "workflowType=machine_learning"


def runs_url(base: str, experiment_id: str) -> str:
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{ML_VIEW}"


def run_url(base: str, experiment_id: str, run_id: str) -> str:
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}?{ML_VIEW}"


def compare_url(base: str, experiment_id: str, run_ids: Sequence[str]) -> str:
    """MLflow's compare-runs page (the UI builds `/compare-runs?runs=[...]&experiments=[...]` with
    JSON lists; quoted here so the URL survives terminals and link checkers)."""
    def as_json(items: Sequence[str]) -> str:
        return quote(json.dumps(list(items), separators=(",", ":")), safe="")
    return (f"{base.rstrip('/')}/#/compare-runs?runs={as_json(run_ids)}&experiments={as_json([experiment_id])}"
            f"&{ML_VIEW}")


@dataclass(frozen=True)
class StudyUrls:
    experiment_id: str
    runs: str  # the study's runs table
    compare: str | None  # the top trials side by side; None without two complete trials
    top_run_ids: tuple[str, ...]


def study_urls(uri: str | None, study: str, base: str = f"http://{LOOPBACK}:{DEFAULT_PORT}", top: int = 5) -> StudyUrls:
    """The UI links of `study` in the store at `uri`, for a UI served at `base`; top trials by the
    study's objective. UsageError (one line) for a missing store or an unknown study."""
    return urls_of(load_study(study, uri), base, top)


def urls_of(data: StudyData, base: str, top: int = 5) -> StudyUrls:
    """`study_urls` of a study already read."""
    run_ids = tuple(top_k(data.trials, data.score, top)["run_id"])
    compare = compare_url(base, data.experiment_id, run_ids) if len(run_ids) >= 2 else None
    return StudyUrls(data.experiment_id, runs_url(base, data.experiment_id), compare, run_ids)


def compare_line(data: StudyData, urls: StudyUrls) -> str:
    """What `main` prints of the compare view: its URL, or why there is none, counted as the view
    counts. Only complete trials with a score compete; the MLflow UI's finished runs also hold the
    study run, repeats, pruned trials and the confirmation and baseline runs, which do not."""
    if urls.compare is not None:
        return f"top {len(urls.top_run_ids)} trials compared: {urls.compare}"
    counts = data.trials["state"].value_counts()
    states = ", ".join(f"{counts[state]} {state}" for state in STATES if state in counts) or "none"
    others = [plural(len(frame), f"{kind} run") for kind, frame in
              (("confirmation", data.confirmations), ("baseline", data.baselines)) if len(frame)]
    also = f"; the experiment's {' and '.join(others)} are not trials" if others else ""
    return (f"nothing to compare yet: {plural(len(urls.top_run_ids), 'complete trial')} with a {data.score.label} "
            f"(trial runs: {states}; repeats and pruned or failed trials have no score of their own){also}")


# ---- the server ---------------------------------------------------------------------------------

@dataclass
class Server:
    url: str
    process: subprocess.Popen
    log_path: Path

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM ends the server and its workers (3-5 s); a server that ignores it is killed."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout_s)
        # The server ran in its own process group: end any worker that outlived it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGTERM)


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = LOOPBACK) -> int:
    """A port nobody listens on now, for a server started soon after (screenshots, tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def start(uri: str | None, port: int = DEFAULT_PORT, host: str = LOOPBACK,
          timeout_s: float = HEALTH_TIMEOUT_S) -> Server:
    """Start `mlflow server` over the store at `uri` and wait until it answers `/health`."""
    uri, _ = open_store(uri)
    if not port_free(host, port):
        raise UsageError(f"--port {port}: already in use on {host}; pass another --port")
    log_path = Path(tempfile.mkstemp(prefix="cramnas-mlflow-ui-", suffix=".log")[1])
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    command = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri,
               "--host", host, "--port", str(port), "--workers", "1"]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    server = Server(f"http://{host}:{port}", process, log_path)
    try:
        _wait_healthy(server, timeout_s)
    except BaseException:  # a timeout, or Ctrl-C while waiting: never leave the server behind
        server.stop()
        raise
    return server


def _wait_healthy(server: Server, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"mlflow server exited with code {server.process.returncode}: "
                               f"{_last_line(server.log_path)} (log {server.log_path})")
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{server.url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"mlflow server did not answer {server.url}/health within {timeout_s:.0f} s "
                       f"(log {server.log_path})")


@contextlib.contextmanager
def serve(uri: str | None, port: int = DEFAULT_PORT, host: str = LOOPBACK,
          timeout_s: float = HEALTH_TIMEOUT_S) -> Iterator[Server]:
    """`start`, then `stop` on leaving the block, whatever happened inside it."""
    server = start(uri, port, host, timeout_s)
    try:
        yield server
    finally:
        server.stop()


def _last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


# ---- CLI ----------------------------------------------------------------------------------------

def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt  # SIGTERM (a supervisor, `kill`) leaves the way Ctrl-C does: server stopped


def build_parser() -> CliParser:
    """The command line of `python -m dashboards.ui` (docs/cli.md is generated from it: docs/gen_cli.py)."""
    parser = CliParser(prog="python -m dashboards.ui", description=__doc__)
    parser.add_argument("--study", help="print this study's runs table and top-5 compare URLs")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port the MLflow UI listens on")
    parser.add_argument("--host", default=LOOPBACK, help="interface to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--tracking-uri", help="default $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        # Check the store and the study before the server's start-up (seconds), not after.
        data = load_study(args.study, args.tracking_uri) if args.study else None
        urls = urls_of(data, f"http://{args.host}:{args.port}") if data is not None else None
        print(f"starting the MLflow UI on {args.host}:{args.port} ...", flush=True)
        with serve(args.tracking_uri, args.port, args.host) as server:
            print(f"MLflow UI: {server.url}")
            if urls is not None:
                print(f"study {args.study} runs: {urls.runs}")
                print(compare_line(data, urls))
            print("Ctrl-C to stop", flush=True)
            while server.process.poll() is None:
                time.sleep(1)
            print(f"error: mlflow server exited with code {server.process.returncode}: "
                  f"{_last_line(server.log_path)}", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        return 0
    except CramnasError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
