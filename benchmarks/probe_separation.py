"""Probe separation: does a probe tell crammed encoders from random ones at CPU scale?

    CRAMNAS_CACHE=/tmp/cramnas-cache python benchmarks/probe_separation.py --data ../shared/data \\
        --arch-overrides '{"layers":1,"hidden":64,"heads":2,"ffn_kind":"gelu","position":"rotary"}' --budget 6e12flops

The profile's run config (cpu: crammed-bert-cpu), its architecture changed by `--arch-overrides`,
is crammed for `--budget` with training seeds 0 .. `--seeds`-1 with the profile's trial settings
(or `--checkpoints DIR ...` are taken instead), and the same architecture is initialised at random
with the same seeds. Every encoder then gets two probes on `--tasks`: the frozen-feature linear
probe (glue.linear_probe, `--max-train-examples` training examples) and the in-trial fine-tuning
probe (glue.probe with the profile's limits: 2,000 examples and 5 s per task on cpu). Encoder i of
either kind is probed with seed i, the same training subset, so pretrained i - random i is a paired
difference in which the subset's luck cancels.

Printed: the pretrained encoders' validation MLM loss against their references and their regime
(trainer/regimes.py), then a markdown table per probe and entry: pretrained mean ± 95% CI
(Student t, search/analysis/stats.py), random mean ± CI, and the paired difference ± CI with whether that
interval excludes zero (outside or within noise). Every finished cram and probe is appended to `--out` as one
JSON line, the crams' checkpoints kept in `--work-dir`; a second call skips what is there
(resumable). A run's lines carry a key of its settings, so other settings never mix in.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from pathlib import Path

import torch
from fidelity import profile_setup

from glue import ProbeLimits, linear_probe, probe
from glue.data import resolve_tasks
from search.analysis.stats import interval, paired
from space.arch import ArchConfig
from space.errors import CramnasError
from trainer.budget import Budget
from trainer.checkpoint import load_checkpoint
from trainer.config import ConfigError
from trainer.corpus import CorpusSource
from trainer.cram import cram_with_model
from trainer.data import prepare_data
from trainer.model import CrammedBert
from trainer.regimes import describe_loss

DEFAULT_BUDGET = "6e12flops"
DEFAULT_TASKS = "sst2,rte,stsb"
PROBES = ("linear", "finetune")
GROUPS = ("pretrained", "random")


class UsageError(CramnasError):
    """A bad flag: the message names it and the fix."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="data directory, e.g. ../shared/data (pretraining corpus and GLUE)")
    parser.add_argument("--profile", default="cpu", help="search/profiles/<name>.yaml: run config, trial settings, probe")
    parser.add_argument("--arch-overrides", default="{}", help='JSON of architecture fields, e.g. \'{"layers":1,"hidden":64}\'')
    parser.add_argument("--budget", help=f"pretraining budget of each cram (default {DEFAULT_BUDGET})")
    parser.add_argument("--seeds", type=int, default=3, help="crams and random inits, seeds 0 .. N-1 (default 3)")
    parser.add_argument("--checkpoints", nargs="+", metavar="DIR", help="probe these crammed checkpoints instead of cramming")
    parser.add_argument("--tasks", default=DEFAULT_TASKS, help=f"GLUE tasks of both probes (default {DEFAULT_TASKS})")
    parser.add_argument("--max-train-examples", type=int, default=4000, help="the linear probe's training examples per task")
    parser.add_argument("--finetune-examples", type=int, help="the fine-tuning probe's cap (default: the profile's)")
    parser.add_argument("--finetune-seconds", type=float, help="its seconds per task (default: the profile's)")
    parser.add_argument("--out", default="probe_separation.jsonl", help="finished crams and probes (resumable)")
    parser.add_argument("--work-dir", help="the crams' checkpoints (default: <out without .jsonl>-checkpoints)")
    parser.add_argument("--cache-dir")
    return parser.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# The encoders
# ---------------------------------------------------------------------------------------------


def architecture(base: ArchConfig, overrides: str) -> ArchConfig:
    try:
        changes = json.loads(overrides)
    except json.JSONDecodeError as error:
        raise UsageError(f"--arch-overrides: not JSON ({error.msg}); write e.g. '{{\"layers\": 1}}'") from None
    if not isinstance(changes, dict):
        raise UsageError("--arch-overrides: expected a JSON object of architecture fields, e.g. '{\"layers\": 1}'")
    return ArchConfig.from_dict({**base.to_dict(), **changes})  # ArchError names a bad field


def checkpoint_encoders(paths: list[str]) -> tuple[ArchConfig, list[Path]]:
    """The one architecture of `--checkpoints` (each must load), and their paths."""
    archs = []
    for path in paths:
        try:
            archs.append(load_checkpoint(path)[0].arch)
        except ConfigError as error:
            raise UsageError(f"--checkpoints: {error}") from None
    if any(arch != archs[0] for arch in archs):
        raise UsageError("--checkpoints: the checkpoints have different architectures; give crams of one architecture")
    return archs[0], [Path(path) for path in paths]


def setup_key(arch: ArchConfig, args: argparse.Namespace, budget: str, limits: ProbeLimits) -> str:
    """A short hash of everything that decides this run's numbers: lines of other runs never mix in."""
    what = {"arch": arch.to_dict(), "budget": budget, "checkpoints": args.checkpoints, "tasks": args.tasks,
            "max_train_examples": args.max_train_examples, "limits": dataclasses.asdict(limits), "profile": args.profile}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:12]


class Journal:
    """The JSON-lines file of finished work, keyed; a line is written as soon as its work is done."""

    def __init__(self, path: Path, setup: str):
        self.path, self.setup = path, setup
        lines = path.read_text().splitlines() if path.exists() else []
        self.done = {row["key"]: row for row in map(json.loads, lines) if row.get("setup") == setup}

    def key(self, *parts: object) -> str:
        return "|".join(map(str, parts))

    def add(self, key: str, row: dict) -> dict:
        row = {"key": key, "setup": self.setup, **row}
        self.done[key] = row
        with self.path.open("a") as file:
            file.write(json.dumps(row) + "\n")
        return row


def cram_pretrained(arch: ArchConfig, args: argparse.Namespace, budget: Budget, seeds: list[int], work: Path,
                    journal: Journal) -> list[Path]:
    """Cram (or find from an earlier call) one checkpoint per seed; their paths."""
    _, train, _ = profile_setup(args.profile)
    data = None
    paths = []
    for seed in seeds:
        out, key = work / f"seed{seed}", journal.key("cram", seed)
        if key not in journal.done or not (out / "model.safetensors").is_file():
            if data is None:  # prepared once, and only when some cram is left to do
                data = prepare_data(CorpusSource.from_args(data_dir=args.data), vocab_size=arch.vocab_size,
                                    seq_len=arch.max_seq_len, cache_dir=args.cache_dir)
            _, result = cram_with_model(arch, dataclasses.replace(train, seed=seed), data, budget, out_dir=out)
            kept = {name: value for name, value in result.to_dict().items() if not name.endswith("curve")}
            journal.add(key, {"kind": "cram", "seed": seed, **kept})
            print(f"crammed seed {seed}: validation MLM loss {result.validation_loss:.4f} ({result.regime}), "
                  f"{result.tokens:,} tokens", flush=True)
        paths.append(out)
    return paths


def cram_records(paths: list[Path]) -> list[dict]:
    """What trainer.cram wrote beside each checkpoint (result.json); {} where there is none."""
    return [json.loads((path / "result.json").read_text()) if (path / "result.json").is_file() else {} for path in paths]


# ---------------------------------------------------------------------------------------------
# The probes
# ---------------------------------------------------------------------------------------------


def encoder(group: str, seed: int, pretrained: list[Path], arch: ArchConfig) -> tuple[CrammedBert, Path]:
    """(model, tokenizer.json): the seed's cram, or the architecture freshly initialised with the seed
    (with the crams' tokenizer: the same inputs, untrained weights)."""
    if group == "pretrained":
        return load_checkpoint(pretrained[seed])
    torch.manual_seed(seed)
    return CrammedBert(arch).eval(), pretrained[seed] / "tokenizer.json"


def run_probes(args: argparse.Namespace, arch: ArchConfig, pretrained: list[Path], limits: ProbeLimits,
               journal: Journal) -> None:
    for seed in range(len(pretrained)):
        for group in GROUPS:
            model, tokenizer = encoder(group, seed, pretrained, arch)
            for kind in PROBES:
                key = journal.key(kind, group, seed)
                if key in journal.done:
                    continue
                if kind == "linear":
                    result = linear_probe(model, tokenizer, args.tasks, data_dir=args.data,
                                          max_train_examples=args.max_train_examples, seed=seed)
                else:
                    result = probe(model, tokenizer, args.tasks, limits=dataclasses.replace(limits, seed=seed))
                row = journal.add(key, {"kind": kind, "group": group, "seed": seed, "scores": result.scores,
                                        "average": result.average, "seconds": result.seconds["total"],
                                        "result": result.to_dict()})
                shown = " ".join(f"{entry}={100 * score:.1f}" for entry, score in row["scores"].items())
                print(f"{kind:>8} probe, {group:>10} seed {seed}: {shown} average={100 * row['average']:.1f} "
                      f"({row['seconds']:.0f} s)", flush=True)


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


def report_crams(records: list[dict], arch: ArchConfig, budget: str) -> None:
    print(f"\npretrained encoders: {arch.describe()}, {budget}\n")
    print("| seed | validation MLM loss | corruption floor | context reference | regime | tokens |\n|---|---|---|---|---|---|")
    for seed, record in enumerate(records):
        if "validation_loss" not in record:
            print(f"| {seed} | (no result.json) | | | | |")
            continue
        print(f"| {seed} | {record['validation_loss']:.4f} | {record.get('corruption_floor', float('nan')):.4f} | "
              f"{record.get('context_reference', float('nan')):.4f} | {record.get('regime', '?')} | {record['tokens']:,} |")
    losses = [record["validation_loss"] for record in records if "validation_loss" in record]
    if not losses:
        return
    loss = interval(losses)
    print(f"\nmean validation MLM loss {loss.text(4)}{' (95% CI)' if loss.has_interval else ''} over {len(losses)} cram(s)")
    last = records[-1]
    if {"unigram_floor", "corruption_floor", "context_reference"} <= set(last):  # absent in results older than them
        print("the mean against the references: "
              + describe_loss(loss.mean, last["unigram_floor"], last["corruption_floor"], last["context_reference"]))


def report_probes(journal: Journal, seeds: int) -> None:
    print(f"\n| probe | entry (main metric x 100) | pretrained (n={seeds}) | random init (n={seeds}) "
          "| paired difference (pretrained - random) |\n|---|---|---|---|---|")
    for kind in PROBES:
        rows = {group: [journal.done[journal.key(kind, group, seed)] for seed in range(seeds)] for group in GROUPS}
        for entry in [*rows["pretrained"][0]["scores"], "average"]:
            values = {group: [row["average"] if entry == "average" else row["scores"][entry] for row in rows[group]]
                      for group in GROUPS}
            pretrained, random = (interval(values[group]).text(1, scale=100) for group in GROUPS)
            difference = paired(values["pretrained"], values["random"]).text(1, scale=100)
            print(f"| {kind} | {entry} | {pretrained} | {random} | {difference} |")
    seconds = [row["seconds"] for row in journal.done.values() if row.get("kind") in PROBES]
    print(f"\nprobe wall time: {sum(seconds):.0f} s over {len(seconds)} probes")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:  # every bad flag fails here, in one line, before any cram or probe
        profile, _, run = profile_setup(args.profile)
        if args.seeds < 1 and not args.checkpoints:
            raise UsageError(f"--seeds: need at least 1, got {args.seeds}")
        if args.checkpoints:
            if args.arch_overrides.strip() != "{}" or args.budget:
                raise UsageError("--arch-overrides, --budget: checkpoints come with their own; leave them out with --checkpoints")
            arch, paths = checkpoint_encoders(args.checkpoints)
            budget = "from the checkpoints"
        else:
            arch, paths = architecture(run.arch, args.arch_overrides), None
            budget = Budget.parse(args.budget or DEFAULT_BUDGET).text
        resolve_tasks(args.tasks, args.data)
        overrides = {"max_train_examples": args.finetune_examples, "max_seconds_per_task": args.finetune_seconds}
        limits = ProbeLimits(**{**profile["probe"]["limits"], **{k: v for k, v in overrides.items() if v is not None},
                                "data_dir": args.data})
    except CramnasError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    out = Path(args.out)
    journal = Journal(out, setup_key(arch, args, budget, limits))
    print(f"{arch.describe()} at {budget}: {len(journal.done)} crams and probes already in {out}", flush=True)
    if paths is None:
        work = Path(args.work_dir or out.with_suffix("").as_posix() + "-checkpoints") / journal.setup
        paths = cram_pretrained(arch, args, Budget.parse(budget), list(range(args.seeds)), work, journal)
    run_probes(args, arch, paths, limits, journal)
    report_crams(cram_records(paths), arch, budget)
    report_probes(journal, len(paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
