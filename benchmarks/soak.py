"""Soak: a long CPU study with short budgets and faults injected at random, then the audit.

    CRAMNAS_CACHE=/tmp/cramnas-cache python benchmarks/soak.py --data ../shared/data \
        [--trials 50 --budget 5s --fault-rate 0.1 --seed 0]

Runs `python -m search.run` (CPU profile, no probe, checkpoints saved so that a full disk can be
injected) in a scratch directory with `CRAMNAS_INJECT_FAULT` naming about `--fault-rate` of the
trial numbers, each with a fault kind drawn from `search.study.trial.FAULT_KINDS`. Then checks:
- the study's two stores agree run for run and add up to `--trials` (`search.audit`);
- each injected fault had its fate: exception, nan, kill and diskfull fail their trial with a
  reason (a diskfull trial that ASHA pruned before its checkpoint write is pruned instead); oom
  never fails one (the micro-batch halves and training goes on).
A fault drawn for an infeasible draw's number (told PRUNED and redrawn, not counted) never runs.
Prints the faults, the counts and the verdict; exits 1 when the verdict is not clean.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FAILS = {"exception": ("RuntimeError", "injected"), "nan": ("NonFiniteLoss",), "kill": ("worker died",),
         "diskfull": ("checkpoint write failed",)}


def draw_faults(trials: int, rate: float, seed: int) -> dict[int, str]:
    from search.study.trial import FAULT_KINDS

    rng = random.Random(seed)
    numbers = sorted(rng.sample(range(trials), max(1, round(rate * trials))))
    return {number: rng.choice(sorted(FAULT_KINDS)) for number in numbers}


def fault_fate(kind: str, state: str, reason: str) -> str | None:
    """None when the trial met the fault as it should; else what went wrong."""
    if kind == "oom":
        return None if state in ("complete", "pruned") else f"oom should not fail a trial ({reason})"
    if kind == "diskfull" and state == "pruned":
        return None  # stopped by ASHA before its checkpoint was due
    if state != "failed":
        return f"{kind} should fail the trial, it is {state}"
    if not any(word in reason for word in FAILS[kind]):
        return f"{kind}: unexpected reason {reason!r}"
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="data directory, e.g. ../shared/data")
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--budget", default="5s")
    parser.add_argument("--fault-rate", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (stores, checkpoints)")
    args = parser.parse_args()

    from search.audit import audit_study
    from search.tracking.tracker import StudyTracker

    faults = draw_faults(args.trials, args.fault_rate, args.seed)
    spec = ";".join(f"{kind}@{','.join(str(n) for n, k in faults.items() if k == kind)}"
                    for kind in sorted(set(faults.values())))
    work = Path(tempfile.mkdtemp(prefix="cramnas-soak-"))
    study, uri = f"soak-{args.seed}", f"sqlite:///{work}/mlflow.db"
    command = [sys.executable, "-m", "search.run", "--profile", "cpu", "--trials", str(args.trials),
               "--budget", args.budget, "--data", str(Path(args.data).resolve()), "--study", study,
               "--tracking-uri", uri, "--no-probe", "--objective", "mlm", "--save-checkpoints",
               "--seed", str(args.seed)]
    print(f"faults ({len(faults)} of {args.trials} trial numbers): {spec}")
    print(" ".join(command))
    started = time.monotonic()
    done = subprocess.run(command, cwd=work, env={**os.environ, "CRAMNAS_INJECT_FAULT": spec},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.monotonic() - started
    print(done.stdout[-3000:])

    audit = audit_study(study, uri, trials=args.trials)
    runs = {int(row["trial"]): row for row in StudyTracker(uri, study).trial_table().to_dict("records")}
    wrong = []
    print("| trial | fault | state | reason |\n|---|---|---|---|")
    for number, kind in faults.items():
        row = runs.get(number)
        if row is None:
            print(f"| {number} | {kind} | not counted (an infeasible draw) | |")
            continue
        state = str(row.get("tags.cramnas.state"))
        reason = row.get("tags.cramnas.failure_reason")
        reason = reason if isinstance(reason, str) else ""
        halvings = row.get("metrics.oom_halvings")
        extra = f" (oom_halvings={halvings:.0f})" if kind == "oom" and halvings == halvings and halvings else ""
        print(f"| {number} | {kind} | {state}{extra} | {reason[:80]} |")
        if (problem := fault_fate(kind, state, reason)) is not None:
            wrong.append(f"trial {number}: {problem}")
    print(f"\nsearch.run exit {done.returncode} after {wall / 60:.1f} min")
    print(audit.summary())
    for problem in audit.problems + wrong:
        print(f"  - {problem}")
    clean = done.returncode == 0 and audit.ok and not wrong
    print(f"verdict: {'CLEAN' if clean else 'NOT CLEAN'}")
    if args.keep:
        print(f"stores and checkpoints kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if clean else 1


if __name__ == "__main__":
    raise SystemExit(main())
