"""Search overhead: the share of a study's wall time spent outside pretraining and the probe, on
each executor.

    python benchmarks/search_overhead.py --data ../shared/data [--trials 6 --budget 30s] [--executors ray,local]

Runs a real CPU study per executor (`search.run --executor`; one trial at a time, ASHA off so every
trial runs its whole budget), one after the other in this process, and compares each study's wall
time with the time its trials spent cramming (training and the held-out evaluation) and probing,
as each trial measured it. The rest is overhead: Ray or the local executor's process start, the
controller, MLflow, data loading. "Warm" leaves out the study's start (Ray start, data cache check,
MLflow store creation) and counts from the first trial's end to the last's. The last line gives
each executor's warm overhead per trial against the first executor's.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import mlflow


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--budget", default="30s")
    parser.add_argument("--probe", action="store_true", help="include the GLUE probe in every trial")
    parser.add_argument("--executors", default="ray,local", help="search.run --executor values, the first the baseline")
    args = parser.parse_args()
    per_trial = {executor: measure(args, executor) for executor in args.executors.split(",")}
    baseline = next(iter(per_trial))
    print("warm overhead per trial: " + ", ".join(f"{executor} {seconds:.2f} s ({seconds / per_trial[baseline]:.2f}x {baseline})"
                                                  for executor, seconds in per_trial.items()))


def measure(args: argparse.Namespace, executor: str) -> float:
    """One study on `executor`; prints its overhead and returns the warm overhead per trial (s)."""
    from search.run import main as search_main

    work = Path(tempfile.mkdtemp(prefix="cramnas-overhead-"))
    uri = f"sqlite:///{work}/mlflow.db"
    flags = ["--trials", str(args.trials), "--budget", args.budget, "--data", args.data, "--study", "overhead",
             "--tracking-uri", uri, "--controller", "random", "--no-early-stop", "--max-concurrent", "1",
             "--executor", executor]
    if not args.probe:
        flags += ["--objective", "mlm", "--no-probe"]
    start = time.time()
    if (code := search_main(flags)) != 0:  # not an assert: `python -O` would skip the study itself
        raise SystemExit(f"search.run exited with {code}; nothing to measure")
    wall = time.time() - start

    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("overhead")
    runs = [r for r in client.search_runs([experiment.experiment_id]) if r.data.tags.get("cramnas.kind") == "trial"]
    runs.sort(key=lambda r: r.info.start_time)
    # Each trial's own clock: cramming, its held-out evaluation, the probe (its data loading included).
    work_seconds = [sum(run.data.metrics.get(key, 0.0) for key in ("seconds", "validation_seconds", "probe_seconds"))
                    for run in runs]
    useful = sum(work_seconds)
    warm_wall = (runs[-1].info.end_time - runs[0].info.end_time) / 1000
    warm_useful = sum(work_seconds[1:])
    print(f"executor={executor} trials={len(runs)} budget={args.budget} probe={args.probe}")
    print(f"study wall {wall:.1f} s, cram+probe {useful:.1f} s: overhead {100 * (1 - useful / wall):.1f}% "
          f"({wall - useful:.1f} s, start-up included)")
    print(f"warm (first trial's end to last's): wall {warm_wall:.1f} s, cram+probe {warm_useful:.1f} s: "
          f"overhead {100 * (1 - warm_useful / warm_wall):.1f}% ({(warm_wall - warm_useful) / (len(runs) - 1):.2f} s "
          f"per trial)")
    return (warm_wall - warm_useful) / (len(runs) - 1)


if __name__ == "__main__":
    main()
