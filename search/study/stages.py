"""A resumable run of command stages: each stage is a list of commands (the ones a user would
type), run `jobs` at a time with their output in `<out>/<stage>.log` (`<stage>-<i>.log` for a
stage of several), and recorded with its wall time in `<out>/state.json` once it passed, so that
running the whole again skips finished stages and re-runs an interrupted one, whose commands resume
themselves (`search.run --resume`; `search.confirm` skips finished runs). benchmarks/proving_ground.py
runs its studies, confirmations, report and accounting through it."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from space.errors import CramnasError

POLL_S = 0.5  # how often a stage of several commands looks for one that ended


class StageError(CramnasError):
    """A stage whose commands did not all pass: one line naming its logs."""


class Stages:
    """Runs the stages once each, recording their wall times in `<out>/state.json`."""

    def __init__(self, out: Path) -> None:
        self.out, self.path = out, out / "state.json"
        self.state = json.loads(self.path.read_text()) if self.path.exists() else {}

    def started(self, name: str) -> bool:
        return name in self.state

    def run(self, name: str, commands: list[list[str]], env: dict[str, str], jobs: int = 1) -> None:
        """Run `commands` as stage `name`, `jobs` at a time, unless it finished before."""
        entry = self.state.setdefault(name, {"seconds": 0.0})
        if entry.get("done"):
            print(f"{name}: done before ({entry['seconds']:.0f} s), skipped")
            return
        self._save()
        logs = [self.out / f"{name}{'-' + str(i) if len(commands) > 1 else ''}.log" for i in range(len(commands))]
        print(f"{name}, {jobs} at a time:" if len(commands) > 1 else f"{name}:", flush=True)
        for command, log in zip(commands, logs):
            print(f"  {' '.join(command[1:]).removeprefix('-m ')}  > {log.name}", flush=True)
        started = time.perf_counter()
        codes = side_by_side(commands, logs, env, jobs)
        entry["seconds"] += time.perf_counter() - started  # summed over interrupted attempts
        self._save()
        if any(codes):
            raise StageError(f"stage {name} failed (exit {codes}); see {self.out}/{name}*.log, then run the "
                             "same command again to resume")
        entry["done"] = True
        self._save()
        print(f"{name}: {entry['seconds']:.0f} s", flush=True)

    def _save(self) -> None:
        self.path.write_text(json.dumps(self.state, indent=2))


def side_by_side(commands: list[list[str]], logs: list[Path], env: dict[str, str], jobs: int) -> list[int]:
    """Run `commands` in their order, at most `jobs` at once, each appending to its log; their exit codes."""
    waiting, running, codes = list(range(len(commands))), {}, [0] * len(commands)
    while waiting or running:
        while waiting and len(running) < jobs:
            i = waiting.pop(0)
            with logs[i].open("a") as log:  # the child keeps its own descriptor
                running[i] = subprocess.Popen(commands[i], stdout=log, stderr=subprocess.STDOUT, env=env)
        time.sleep(POLL_S)
        for i in [i for i, process in running.items() if process.poll() is not None]:
            codes[i] = running.pop(i).returncode
    return codes
