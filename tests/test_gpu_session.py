"""benchmarks/gpu_session.sh runs on a CPU (issue 20 §6): its dry run takes every step of the GPU
session (interpreter check, compile preflight, gpu_check, cram, a 4-trial search on the local
executor, the probe) at
tiny sizes, so that the one device call a session gets is known not to fail on the script."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT, cli_env


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_gpu_session_dry_run_runs_every_step(wiki_slice_dir, tmp_path):
    out = tmp_path / "out"
    env = cli_env(OUT=str(out), PYTHON=sys.executable, CRAMNAS_CACHE=str(tmp_path / "cache"))
    env.pop("PYTHONPATH")  # the script must put the project on the path itself
    done = subprocess.run(["bash", "benchmarks/gpu_session.sh", "--dry-run", str(wiki_slice_dir)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1500)
    log = (out / "gpu_session.log").read_text()
    assert done.returncode == 0, log[-3000:]
    assert "imports: ok" in log
    assert "compile preflight: ok" in log or "compiled steps run EAGER" in log
    for step in ("gpu_check", "cram", "search", "probe"):
        assert f"=== {step}: exit 0 after" in log, f"step {step} failed:\n{log[-3000:]}"
    assert "compile=False steps=3 tokens/s=" in log  # the dry run's gpu_check: 3 steps of 6 micro-batches
    assert json.loads((out / "cram_result.json").read_text())["tokens"] > 0
    trials = json.loads((out / "search_trials.json").read_text())
    assert [trial["state"] for trial in trials] == ["COMPLETE"] * 4
    assert all("probe_average" in trial["attrs"]["metrics"] for trial in trials)
