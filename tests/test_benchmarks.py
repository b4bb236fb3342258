"""Benchmark scripts keep working: their CPU paths run here (the GPU numbers come from a lent GPU)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.subprocess
def test_gpu_check_dry_run_prints_throughput_and_mfu():
    out = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"], cwd=ROOT,
                         env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert lines[0].startswith("device=cpu") and "flops/token=" in lines[0]
    assert lines[1].startswith("matmul achievable=") and "datasheet=989 TFLOP/s" in lines[1]
    assert re.match(r"compile=False steps=\d+ tokens/s=", lines[2]) and "of achievable" in lines[2] \
        and "of datasheet" in lines[2]
    assert re.match(r"compile=True steps=\d+ tokens/s=", lines[3])
    assert lines[4].startswith("compile speed-up=") and "compile seconds=" in lines[4]


@pytest.mark.slow
@pytest.mark.subprocess
def test_model_throughput_prints_the_ratio_line():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "model_throughput.py"), "--layers", "1",
                          "--hidden", "32", "--heads", "2", "--vocab", "256", "--seq", "16", "--batch", "4",
                          "--steps", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1].split()
    assert last[0] == "tokens/s" and [part.split("=")[0] for part in last[1:]] == ["cramnas", "hf", "ratio"]
    assert float(last[3].split("=")[1]) > 0


def benchmark_lines(script: str, *args: str) -> list[str]:
    """What `benchmarks/<script> args` prints, line by line, once it has exited 0."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


@pytest.mark.slow
@pytest.mark.subprocess
def test_host_overhead_prints_before_and_after():
    lines = benchmark_lines("host_overhead.py", "--steps", "2")
    assert lines[0].startswith("device=cpu") and "config=crammed-bert-cpu" in lines[0]
    for line, kind in zip(lines[1:], ("before", "after")):
        assert line.split(":")[0].strip() == kind and "forward/backward" in line and "outside it" in line


@pytest.mark.slow
@pytest.mark.subprocess
def test_clock_overhead_prints_before_and_after():
    lines = benchmark_lines("clock_overhead.py", "--repeats", "2")
    assert lines[0].startswith("device=cpu") and "config=crammed-bert-cpu" in lines[0]
    for line, name in zip(lines[1:], ("masking", "snapshot")):
        assert line.split()[0] == name and " before " in line and " after " in line and "in the clock now" in line
    assert lines[2].endswith("in the clock now 0.000 ms")  # the loop stops its clock around a snapshot
