"""Issue 13: a study on a Ray cluster whose nodes do not share a cache. The driver prepares the data
once; a trial on a node whose cache lacks it writes the driver's shipped files there, once per node
(`trainer.data.open_prepared`, `search.study.trial.ShippedData`), and never tokenises the corpus itself.

The cluster is two `ray start` nodes on this machine, each with its own CRAMNAS_CACHE. A Ray started
with RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 (tests/conftest.py) refuses a second node, so these nodes
run in cluster mode on the loopback addresses 127.0.0.2 and 127.0.0.3: no traffic leaves the machine.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from tests.helpers import cli_env, free_port, requires_shared_data
from tests.studies import PROFILE, check_stores_agree
from trainer.corpus import DataError
from trainer.data import MANIFEST, entry_files, open_prepared

pytestmark = requires_shared_data

HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"
NODE_START_S = 60


def test_a_shipped_entry_is_fetched_and_written_once_per_machine(wiki_slice, tmp_path):
    fingerprint, driver_cache = wiki_slice.fingerprint, wiki_slice.tokenizer_path.parents[2]
    fetches = []

    def fetch():
        fetches.append(fingerprint)
        time.sleep(0.5)  # the other trials of this machine arrive meanwhile, and wait on the lock
        return entry_files(fingerprint, driver_cache)

    node = tmp_path / "node"
    with ThreadPoolExecutor(4) as pool:
        opened = list(pool.map(lambda _: open_prepared(fingerprint, node, fetch), range(4)))
    assert len(fetches) == 1
    assert sorted(source for _, source in opened) == ["cache", "cache", "cache", "shipped"]
    for data, _ in opened:
        assert data.manifest == wiki_slice.manifest and data.unigram_floor == wiki_slice.unigram_floor
        assert np.array_equal(data.train, wiki_slice.train) and np.array_equal(data.validation, wiki_slice.validation)
        assert data.tokenizer.get_vocab() == wiki_slice.tokenizer.get_vocab()
    assert [path.name for path in (node / "data").iterdir() if not path.name.startswith(".")] == [fingerprint]
    assert not (node / "tokenizers").exists()  # nothing trained or tokenised here
    assert open_prepared(fingerprint, node)[1] == "cache"  # and later trials need no fetch


def test_data_neither_cached_nor_shipped_fails_in_one_line(tmp_path):
    with pytest.raises(DataError, match=r"prepared data 0123456789abcdef is not in .*CRAMNAS_CACHE"):
        open_prepared("0123456789abcdef", tmp_path)


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_study_on_two_nodes_ships_the_data_once_to_the_node_without_it(wiki_slice_dir, slice_cache, tmp_path):
    """Node A's cache holds the slice, node B's is empty: B's trial gets the driver's files through
    Ray, A's reads its own, and neither trains a tokenizer."""
    driver_cache, node_a, node_b = tmp_path / "driver", tmp_path / "node_a", tmp_path / "node_b"
    shutil.copytree(slice_cache, driver_cache)  # the driver finds the slice prepared
    shutil.copytree(slice_cache, node_a)
    node_b.mkdir()
    ray_root = Path(tempfile.mkdtemp(prefix="cn-ray-"))  # short: Ray's socket paths must fit 107 characters
    port = free_port()
    env = dict(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="1", RAY_worker_niceness="0")
    nodes = []

    def start_node(cache: Path, name: str, *flags: str) -> None:
        log = ray_root / f"{name}.log"
        with open(log, "w") as out:
            nodes.append(subprocess.Popen(
                [str(Path(sys.executable).with_name("ray")), "start", *flags, "--num-cpus", "1", "--disable-usage-stats",
                 "--temp-dir", str(ray_root / "ray"), "--block"],
                env=cli_env(CRAMNAS_CACHE=str(cache), **env), stdout=out, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + NODE_START_S
        while "will now block forever" not in log.read_text():  # `ray start` prints it once the node is up
            if nodes[-1].poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start of node {name} failed: {log.read_text()[-2000:]}")
            time.sleep(0.5)

    try:
        start_node(node_a, "a", "--head", "--node-ip-address", HEAD_IP, "--port", str(port),
                   "--include-dashboard=false")
        start_node(node_b, "b", "--address", f"{HEAD_IP}:{port}", "--node-ip-address", WORKER_IP)
        driver = subprocess.run(
            [sys.executable, "-m", "search.run", "--profile", str(PROFILE), "--data", str(wiki_slice_dir),
             "--study", "two-nodes", "--seed", "1", "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db",
             "--storage", f"sqlite:///{tmp_path}/optuna.db", "--address", f"{HEAD_IP}:{port}", "--trials", "2",
             "--max-concurrent", "2", "--cpus-per-trial", "1", "--controller", "random", "--objective", "mlm",
             "--no-probe", "--no-early-stop"],
            env=cli_env(CRAMNAS_CACHE=str(driver_cache), **env), cwd=tmp_path, capture_output=True, text=True,
            timeout=240)
        assert driver.returncode == 0, driver.stdout[-2000:] + driver.stderr[-3000:]
    finally:
        for node in reversed(nodes):  # SIGTERM: `ray start --block` stops its node's processes (never `ray stop`)
            node.terminate()
        for node in nodes:
            try:
                node.wait(timeout=30)
            except subprocess.TimeoutExpired:
                node.kill()
                node.wait()
        shutil.rmtree(ray_root, ignore_errors=True)

    study, runs = check_stores_agree(tmp_path, "two-nodes", 2)
    assert [trial.state for trial in study.trials] == [TrialState.COMPLETE] * 2
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    got = [json.loads(Path(client.download_artifacts(run["run_id"], "result.json", str(tmp_path / run["run_id"])))
                      .read_text())["data"] for run in runs]
    assert len({data["node"] for data in got}) == 2, got  # one trial on each node
    assert sorted(data["source"] for data in got) == ["cache", "shipped"], got

    (entry,) = [path for path in (driver_cache / "data").iterdir() if not path.name.startswith(".")]
    shipped = node_b / "data" / entry.name
    assert (shipped / MANIFEST).read_text() == (entry / MANIFEST).read_text()  # the driver's entry, byte for byte
    assert (shipped / "train.bin").read_bytes() == (entry / "train.bin").read_bytes()
    assert not (node_b / "tokenizers").exists() and not (node_b / "hf-datasets").exists()  # nothing prepared on B
