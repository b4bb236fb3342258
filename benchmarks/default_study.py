"""The study a user runs, measured (issue 38): the README's 32-trial command at three controller
seeds, its winners confirmed with fresh seeds beside sized-cpu, and how well each progress report
ranks the final loss (the measurement behind early stopping's default). The command screened,
`--screen 4`, the CPU profile's default since 2026-12-07 (studies bracket-sS and their screens
bracket-sS-screen); with every trial crammed whole, the default before it and now `--screen 1`
(studies default-sS); with `--early-stop` (studies early-sS), what it spent against every trial
run to its end; the controller benchmark's lead, `--controller tpe --early-stop --trials 62` at
seed 0 (lead-tpe-early). The 200-trial command likewise: bracket-200 and default-200. Since
2026-12-08 the profile promotes an eighth (`--promote 8`): the bracket studies' promotions run again
so (eighth-sS), and the command with nothing changed at a seed no other study ran (fresh-sS).

    # after  python -m search.run --trials 32 --budget 2e12flops --data ../shared/data --no-probe --seed S --study default-sS
    # and    python -m search.confirm --study default-sS --top 1 --seeds 3 --baselines sized-cpu --data ../shared/data
    #        (the default-sS studies ran before the screen was the default; the same with --screen 4
    #        --study bracket-sS, or --early-stop --study early-sS)
    python benchmarks/default_study.py export --study default-s0 --storage sqlite:///optuna.db --tracking-uri sqlite:///mlflow.db
    python benchmarks/default_study.py export --study bracket-s0-screen --storage sqlite:///optuna.db   # no confirmations
    # (likewise fresh-s3 and fresh-s3-screen: --seed 3 --study fresh-s3, today's defaults)
    # the screened studies' promotions again with the CPU default's share, from a copy of each screen
    python benchmarks/default_study.py restore --study bracket-s1-screen --as eighth-s1-screen --storage sqlite:///optuna.db
    #        python -m search.run --trials 32 --budget 2e12flops --data ../shared/data --no-probe --seed 1 \
    #            --study eighth-s1 --resume --promote 8      (the copied screen recorded a quarter: say the share)
    python benchmarks/default_study.py export --study eighth-s1 --storage sqlite:///optuna.db
    # sized-cpu at 2x, 4x, 8x and 16x with the confirmation seeds (python -m trainer.cram ... --seed 1001 --out DIR)
    python benchmarks/default_study.py export-crams --name sized-cpu-ladder --configuration sized-cpu DIR [DIR ...]
    # the other hand designs at 1x with the same seeds, which one a winner has to beat
    python benchmarks/default_study.py export-crams --name hand-designs --configuration neobert-cpu DIR [DIR ...]
    python benchmarks/default_study.py report        # the RESULTS tables, from benchmarks/crams/ alone
    # on another machine: the study back into a storage, then  python -m search.run ... --study default-200 --resume
    python benchmarks/default_study.py restore --study default-200 --storage sqlite:///optuna.db

Every cram behind the tables is a row of a small CSV under benchmarks/crams/, keyed by (study,
trial) or by (configuration, budget, seed): never by the architecture's fingerprint, which a change
of `ArchConfig.canonical` may respell. `report` reads nothing else. `export` also keeps the study's
Optuna records (`<study>.optuna.jsonl.gz`, an Optuna journal): a study longer than one machine's
life (the 200-trial one) is restored from it and resumed where it stopped.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import statistics
import tempfile
from pathlib import Path

from search.analysis.accounting import compute_equivalent, payback
from search.analysis.stats import correlation, interval, paired
from search.base.paths import PROFILES
from search.run import check_storage, load_profile
from search.study import asha
from search.study.estimate import asha_rungs
from search.study.screen import SUFFIX as SCREEN_SUFFIX
from search.study.screen import promoted_count
from search.study.stopped import rung_ranking
from space.arch import ArchConfig
from space.errors import UsageError
from trainer.budget import Budget

CRAMS = Path(__file__).resolve().parent / "crams"
TRIAL_COLUMNS = ["study", "trial", "state", "first_draw", "repeat_of", "architecture", "validation_loss",
                 "nats_below_floor", "corruption_floor", "context_reference", "tokens", "flops_per_token", "seconds",
                 "curve", "arch", "budget_fraction"]
RUN_COLUMNS = ["name", "kind", "configuration", "budget", "seed", "validation_loss", "tokens", "flops_per_token",
               "seconds"]
BASELINE = "sized-cpu"
SCREEN = 4  # the screened studies' --screen: their screen crams at a quarter of the trial budget
PROMOTED = 4  # and the share they promoted, --promote 4 (--screen's own until 2026-12-08): the best quarter
DEFAULT_PROMOTE = load_profile(PROFILES / "cpu.yaml")["screen"]["promote"]  # the CPU profile's since: read from them
HAND_DESIGNS = "hand-designs"  # the other hand designs crammed on the confirmations' seeds
TRIAL_FLOPS = 2e12  # the README's trial budget, 2e12flops
ASHA = load_profile(PROFILES / "cpu.yaml")["early_stop"]  # the rungs `search.run --early-stop` uses


# ---- export: the stores of one study into benchmarks/crams/ -------------------------------------

def export_study(study_name: str, storage: str, tracking_uri: str | None) -> list[Path]:
    import optuna

    from search.base import attrs
    from search.base.states import state_of_trial
    from search.study.view import first_draw_mark

    study = optuna.load_study(study_name=study_name, storage=storage)
    rows = []
    for trial in study.get_trials(deepcopy=False):
        user, metrics = trial.user_attrs, trial.user_attrs.get(attrs.METRICS, {})
        arch = user.get(attrs.ARCH)
        rows.append({"study": study_name, "trial": trial.number, "state": state_of_trial(trial),
                     "first_draw": first_draw_mark(user).strip(" ()"), "repeat_of": user.get(attrs.REPEAT_OF, ""),
                     "architecture": ArchConfig.from_dict(arch).describe() if arch else "",
                     **{key: metrics.get(key, "") for key in TRIAL_COLUMNS[6:13]},
                     "curve": " ".join(f"{loss:.5f}" for _, loss in user.get(attrs.INTERMEDIATE, [])),
                     "arch": json.dumps(arch, sort_keys=True) if arch else "",
                     # how far a trial that ASHA stopped got: its share of the budget at its last report
                     "budget_fraction": metrics.get("budget_fraction", "")})
    written = [write(CRAMS / f"{study_name}.csv", TRIAL_COLUMNS, rows), keep_study(study_name, storage)]
    if tracking_uri:
        written.append(write(CRAMS / f"{study_name}-confirm.csv", RUN_COLUMNS, confirmation_rows(study_name, tracking_uri)))
    return written


def confirmation_rows(study_name: str, tracking_uri: str) -> list[dict]:
    """search.confirm's runs of the study: each candidate (`trial N`) and baseline at each seed."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    runs = mlflow.search_runs(experiment_names=[study_name])
    rows = []
    for _, run in runs.iterrows():
        if run.get("tags.cramnas.kind") not in ("confirmation", "baseline") or run.get("tags.cramnas.state") != "complete":
            continue
        kind = run["tags.cramnas.kind"]
        configuration = run["tags.cramnas.baseline"] if kind == "baseline" else f"trial {run['tags.cramnas.original_trial']}"
        rows.append({"name": study_name, "kind": kind, "configuration": configuration,
                     "budget": run["params.budget"] if "params.budget" in run else "", "seed": run["tags.cramnas.seed"],
                     **{key: run.get(f"metrics.{key}", "") for key in RUN_COLUMNS[5:]}})
    return sorted(rows, key=lambda row: (row["configuration"], row["budget"], int(row["seed"])))


def export_crams(name: str, configuration: str, run_dirs: list[str]) -> Path:
    """trainer.cram runs of `configuration` (each directory's result.json) added to `<name>.csv`: a
    run of the same configuration, budget and seed replaces its row, every other row stays."""
    path = CRAMS / f"{name}.csv"
    rows = {cram_key(row): row for row in (read(path) if path.is_file() else [])}
    for run_dir in run_dirs:
        result = json.loads((Path(run_dir) / "result.json").read_text())
        row = {"name": name, "kind": "baseline", "configuration": configuration, "budget": result["budget"],
               "seed": result["seed"], **{key: result[key] for key in RUN_COLUMNS[5:]}}
        rows[cram_key(row)] = row
    return write(path, RUN_COLUMNS, sorted(rows.values(), key=cram_key))


def cram_key(row: dict) -> tuple[str, float, int]:
    """What a cram is: its configuration, budget (as FLOPs, however it was spelled) and seed."""
    return row["configuration"], Budget.parse(row["budget"]).amount, int(row["seed"])


def write(path: Path, columns: list[str], rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as out:
        writer = csv.DictWriter(out, columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


# ---- keep and restore: a study's Optuna records, so that it outlives the machine that runs it -----

def journal(path: Path):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    return JournalStorage(JournalFileBackend(str(path)))


def kept(study_name: str, crams: Path = CRAMS) -> Path:
    return crams / f"{study_name}.optuna.jsonl.gz"


def keep_study(study_name: str, storage: str, crams: Path = CRAMS) -> Path:
    """Every record of the study (its settings; each trial's parameters, state, reports and
    attributes, a running one included) as a gzipped Optuna journal, `<study>.optuna.jsonl.gz`."""
    import optuna

    path = kept(study_name, crams)
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "journal.log"
        optuna.copy_study(from_study_name=study_name, from_storage=storage, to_storage=journal(copy))
        # Optuna names the writing process in each line with a fresh UUID; one fixed name instead makes
        # an unchanged study the same file, so that a re-export is no change for git.
        lines = [json.dumps({**json.loads(line), "worker_id": "kept"}, separators=(",", ":"))
                 for line in copy.read_text().splitlines()]
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as out, gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as packed:
            packed.write(("\n".join(lines) + "\n").encode())
    return path


def restore_study(study_name: str, storage: str, crams: Path = CRAMS, to_name: str | None = None) -> None:
    """The kept study copied into `storage` (as `to_name`: a study of its own), where `search.run
    --study NAME --resume` goes on with it (its trials left running are failed and run again;
    MLflow's runs are rewritten from it)."""
    import optuna

    path = kept(study_name, crams)
    if not path.is_file():
        raise SystemExit(f"restore --study: no {path}; `export --study {study_name}` keeps a study there")
    try:
        check_storage(storage, "restore --storage")  # a bad URL in one line, not SQLAlchemy's traceback
    except UsageError as error:
        raise SystemExit(str(error)) from None
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "journal.log"
        copy.write_bytes(gzip.decompress(path.read_bytes()))
        try:
            optuna.copy_study(from_study_name=study_name, from_storage=journal(copy), to_storage=storage,
                              to_study_name=to_name or study_name)
        except optuna.exceptions.DuplicatedStudyError:
            raise SystemExit(f"restore --storage: {storage} holds a study {to_name or study_name} already; resume it there "
                             "or pass an empty storage") from None


# ---- report: the tables, from the CSVs alone --------------------------------------------------

def read(path: Path) -> list[dict]:
    with path.open(newline="") as rows:
        return list(csv.DictReader(rows))


def studies(kind: str = "default", crams: Path = CRAMS) -> dict[str, list[dict]]:
    """The studies `<kind>-sS` (default: the README's command with every trial crammed whole, the
    default until 2026-12-07; early: with --early-stop; bracket: screened, --screen 4 --promote 4,
    the promotion's trials; eighth: their promotions run again with --promote 8; fresh: the
    command with the defaults since 2026-12-08 at a seed no other study ran), by name."""
    return {path.stem: read(path) for path in sorted(crams.glob(f"{kind}-s[0-9]*.csv"))
            if not path.stem.endswith(("-confirm", SCREEN_SUFFIX))}


def trained(rows: list[dict]) -> list[dict]:
    """The trials that trained to their end (repeats copy an earlier trial's result)."""
    return [row for row in rows if row["state"] == "complete" and row["validation_loss"]]


def stopped(rows: list[dict]) -> list[dict]:
    """The trials that ASHA stopped (their first cram, not a repeat's copy)."""
    return [row for row in rows if row["state"] == "pruned"]


def cram_flops(row: dict) -> float:
    """The training FLOPs of a trial that ran to its end."""
    return float(row["tokens"]) * float(row["flops_per_token"])


def baseline_loss(done: list[dict]) -> float:
    """The loss of the study's warm start of the baseline (sized-cpu), among its trials run to the end."""
    return next(float(row["validation_loss"]) for row in done if row["first_draw"] == f"warm start {BASELINE}")


def spent_flops(rows: list[dict]) -> float:
    """The training FLOPs a study spent: each trial run to its end, and each stopped trial's share
    of its budget when stopped."""
    return (sum(cram_flops(row) for row in trained(rows))
            + sum(float(row["budget_fraction"]) * TRIAL_FLOPS for row in stopped(rows)))


def curve(row: dict) -> dict[int, float]:
    return {step: float(loss) for step, loss in enumerate(row["curve"].split(), start=1)}


def rung_table(all_rows: dict[str, list[dict]]) -> str:
    """Spearman of the train loss at each report with the final validation loss, over the distinct
    architectures of every study (the first trial of each)."""
    distinct: dict[str, dict] = {}
    for rows in all_rows.values():
        for row in trained(rows):
            distinct.setdefault(row["arch"], row)
    rows = list(distinct.values())
    # Off the plateau (more than 0.05 nats below the corruption floor: trainer/regimes.py) is where
    # winners are; there a report must rank more than "left the plateau or not".
    off = [row for row in rows if float(row["nats_below_floor"]) > 0.05]
    ranks = rung_ranking([curve(row) for row in rows], [float(row["validation_loss"]) for row in rows])
    ranks_off = {rank.report: rank for rank in rung_ranking([curve(row) for row in off],
                                                            [float(row["validation_loss"]) for row in off])}
    reports = max(len(curve(row)) for row in rows)
    early_stop_rungs = asha_rungs(ASHA["grace_reports"], ASHA["reduction_factor"], reports + 1)
    lines = [f"Over {len(rows)} distinct architectures ({described(rows)}), trained to the end at 2e12 FLOPs, "
             f"{len(off)} of them off the plateau:", "",
             "| report | of the budget | Spearman with the final loss, all (95% bootstrap) | off the plateau only |",
             "|---|---|---|---|"]
    for rank in ranks:
        mark = " (a rung of --early-stop)" if rank.report in early_stop_rungs else ""
        other = ranks_off.get(rank.report)
        lines.append(f"| {rank.report}{mark} | {rank.report / (reports + 1):.0%} | {rank.spearman:.2f} "
                     f"({rank.low:.2f} to {rank.high:.2f}) | "
                     + (f"{other.spearman:.2f} ({other.low:.2f} to {other.high:.2f}) |" if other else "- |"))
    return "\n".join(lines)


REPLAYED = ((1, 2), (2, 2), (4, 2), (4, 3), (8, 2))  # (grace reports, reduction factor)


def replay_table(all_rows: dict[str, list[dict]]) -> str:
    """ASHA replayed with other rungs on each study's trials: what it keeps and what it spends."""
    lines = ["| study | " + " | ".join(f"grace {g}, reduction {f}" for g, f in REPLAYED) + " |",
             "|---|" + "---|" * len(REPLAYED)]
    for name, rows in all_rows.items():
        cells = []
        for grace, factor in REPLAYED:
            replay = asha_replay(rows, grace, factor)
            kept = ("best kept" if replay["keeps_best"]
                    else f"best lost (kept {float(replay['best_kept']['validation_loss']):.3f})")
            cells.append(f"{replay['kept']} of {replay['trials']} run to the end, {kept}, "
                         f"{replay['flops_share']:.0%} of the FLOPs")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def described(rows: list[dict]) -> str:
    archs = [json.loads(row["arch"]) for row in rows]

    def count(field: str) -> str:
        values = sorted({str(arch[field]) for arch in archs})
        return f"{len(values)} {field} values"

    sizes = {(arch["layers"], arch["hidden"]) for arch in archs}
    return f"{len(sizes)} layers x hidden sizes, {count('position')}, {count('norm_placement')}, {count('ffn_kind')}"


def named(row: dict) -> str:
    """A trial as the tables name it: its number, architecture and, from the first draw, what it was."""
    return f"{row['trial']} {row['architecture']}" + (f" ({row['first_draw']})" if row["first_draw"] else "")


def beating(own: list[dict], baseline: float) -> str:
    """How many of the controller's own trials end 0.1 nats or more below the baseline's loss."""
    return f"{sum(float(row['validation_loss']) < baseline - 0.1 for row in own)} of {len(own)}"


def asha_replay(rows: list[dict], grace: int, factor: int) -> dict:
    """ASHA's rule replayed on a study's trials in trial order (search.study.asha.replay): how many
    it keeps, whether it keeps the study's best, and the share of the FLOPs it would have spent."""
    done = sorted(trained(rows), key=lambda row: int(row["trial"]))
    replayed = asha.replay([curve(row) for row in done],
                           [cram_flops(row) for row in done], grace, factor)
    kept = [done[index] for index in replayed.kept]
    best = min(done, key=lambda row: float(row["validation_loss"]))
    best_kept = min(kept, key=lambda row: float(row["validation_loss"]))
    return {"trials": len(done), "kept": len(kept), "keeps_best": best in kept, "best": best, "best_kept": best_kept,
            "flops_share": replayed.budget_share}


def study_table(all_rows: dict[str, list[dict]]) -> str:
    lines = ["| study | trials trained | best trial | its loss | first draw's best | controller's best | "
             f"controller's trials 0.1 nats below {BASELINE} | FLOPs | ASHA replayed (grace {ASHA['grace_reports']}, "
             f"reduction {ASHA['reduction_factor']}): kept, keeps the best?, FLOPs |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, rows in all_rows.items():
        done = trained(rows)
        best = min(done, key=lambda row: float(row["validation_loss"]))
        first = [row for row in done if row["first_draw"]]
        own = [row for row in done if not row["first_draw"]]
        baseline = baseline_loss(done)
        flops = sum(cram_flops(row) for row in done)
        replay = asha_replay(rows, ASHA["grace_reports"], ASHA["reduction_factor"])
        best_first, best_own = (min(group, key=lambda row: float(row["validation_loss"])) for group in (first, own))
        kept = "yes" if replay["keeps_best"] else f"no: best kept {float(replay['best_kept']['validation_loss']):.3f}"
        lines.append(
            f"| {name} | {len(done)} | {named(best)} | {float(best['validation_loss']):.3f} "
            f"| {float(best_first['validation_loss']):.3f} ({best_first['first_draw']}) "
            f"| {float(best_own['validation_loss']):.3f} | {beating(own, baseline)} "
            f"| {flops:.3g} | {replay['kept']} of {replay['trials']}, {kept}, {replay['flops_share']:.0%} |")
    return "\n".join(lines)


def seeds(rows: list[dict], configuration: str, budget: str) -> dict[int, float]:
    return {int(row["seed"]): float(row["validation_loss"]) for row in rows
            if row["configuration"] == configuration and row["budget"] == budget and row["validation_loss"]}


def multiple_text(multiple: float | None, ladder: dict[float, float]) -> str:
    """A compute-equivalent multiple (search.analysis.accounting.compute_equivalent) as the table shows it."""
    if multiple is None:
        return f"more than {max(ladder):g}x"
    return "1x or less" if multiple <= min(ladder) else f"{multiple:.1f}x"


def baseline_seeds(budget: str = "2e12flops") -> dict[int, float]:
    """sized-cpu on the confirmations' fresh seeds, each seed as the first confirmation crammed it
    (the default studies', which crammed it first, then the others by file name): the same cram
    whichever study confirmed it, up to the CPU's arithmetic (the fourth decimal between the
    machines that ran them)."""
    pooled: dict[int, float] = {}
    for path in sorted(CRAMS.glob("*-confirm.csv"), key=lambda path: (not path.name.startswith("default-"), path.name)):
        for seed, loss in seeds(read(path), BASELINE, budget).items():
            pooled.setdefault(seed, loss)
    return pooled


def compute_ladder(theirs: dict[int, float], rows: list[dict]) -> dict[float, float]:
    """sized-cpu's mean loss at each multiple of the trial budget: 1x from the confirmations' seeds
    (`theirs`), the rest from every budget of the ladder's `rows` (crams/sized-cpu-ladder.csv)."""
    ladder = {1.0: statistics.mean(theirs.values())}
    for budget in {row["budget"] for row in rows if row["configuration"] == BASELINE}:
        ladder[Budget.parse(budget).amount / TRIAL_FLOPS] = statistics.mean(seeds(rows, BASELINE, budget).values())
    return dict(sorted(ladder.items()))


def confirmed(name: str, rows: list[dict], budget: str = "2e12flops") -> dict | None:
    """Study `name`'s winner on its confirmation's fresh seeds (`<name>-confirm.csv`) beside sized-cpu,
    with its compute-equivalent multiple and the payback of the search (`rows`, its trials: a
    screened study's with its screen's), or None without a confirmation. `mismatch` names the
    study's best trial where the confirmation crammed another."""
    path = CRAMS / f"{name}-confirm.csv"
    if not path.is_file():
        return None
    runs = read(path)
    candidate = next(row["configuration"] for row in runs if row["kind"] == "confirmation")
    best = min((row for row in trained(rows) if row["study"] == name), key=lambda row: float(row["validation_loss"]))
    ours = seeds(runs, candidate, budget)
    theirs = seeds(runs, BASELINE, budget) or baseline_seeds(budget)  # paired with the baseline its own confirmation crammed
    ladder_path = CRAMS / f"{BASELINE}-ladder.csv"
    ladder = compute_ladder(theirs, read(ladder_path) if ladder_path.is_file() else [])
    multiples = list(ladder)
    multiple = compute_equivalent(multiples, list(ladder.values()), statistics.mean(ours.values()))
    # The search's compute, as benchmarks/accounting.py counts it: every trial it trained and the
    # winner's confirmations (a user runs both before the final cram).
    search_flops = spent_flops(rows) + sum(cram_flops(run) for run in runs if run["configuration"] == candidate)
    # Paid back against the multiple as the table shows it; past the ladder's top, a bound.
    account = payback(search_flops, TRIAL_FLOPS, multiples[-1] if multiple is None else round(multiple, 1))
    return {"candidate": candidate, "mismatch": None if candidate == f"trial {best['trial']}" else f"trial {best['trial']}",
            "ours": ours, "theirs": theirs, "difference": paired(ours, theirs), "ladder": ladder, "multiple": multiple,
            "search_runs": account["search_in_final_runs"], "payback": account["payback_runs"]}


def payback_text(record: dict) -> str:
    if record["payback"] is None:
        return "never"
    return f"{'under ' if record['multiple'] is None else ''}{record['payback']:.1f}"


def confirmation_table(all_rows: dict[str, list[dict]], budget: str = "2e12flops") -> str:
    lines = [f"| study | winner | winner, 3 fresh seeds | {BASELINE}, same seeds | paired (winner - {BASELINE}) | "
             f"{BASELINE}'s compute for the winner's loss | search FLOPs in final runs | payback (final runs) |",
             "|---|---|---|---|---|---|---|---|"]
    for name, rows in all_rows.items():
        record = confirmed(name, rows, budget)
        if record is None:
            continue
        if record["mismatch"]:  # another winner than the one crammed on fresh seeds: nothing to read
            lines.append(f"| {name} | {record['mismatch']}, not confirmed (the confirmation crammed "
                         f"{record['candidate']}) | - | - | - | - | - | - |")
            continue
        lines.append(f"| {name} | {record['candidate']} | {interval(record['ours'].values()).text()} "
                     f"| {interval(record['theirs'].values()).text()} | {record['difference'].text()} "
                     f"| {multiple_text(record['multiple'], record['ladder'])} | {record['search_runs']:.1f} "
                     f"| {payback_text(record)} |")
    ladder_rows = read(CRAMS / f"{BASELINE}-ladder.csv") if (CRAMS / f"{BASELINE}-ladder.csv").is_file() else []
    ladder_text = ", ".join(f"{budget}: {interval(seeds(ladder_rows, BASELINE, budget).values()).text()}"
                            for budget in sorted({row["budget"] for row in ladder_rows}, key=lambda b: Budget.parse(b).amount))
    return "\n".join(lines) + (f"\n\n{BASELINE} up the compute axis, same seeds: {ladder_text}." if ladder_text else "")


def target_table(all_rows: dict[str, list[dict]]) -> str:
    """Issue 38's target, study by study, met or not: screened studies' trials with their screens'
    (`with_screens`), each beside the same trials crammed whole at the trial budget."""
    names = list(all_rows)
    cells: dict[str, list[str]] = {row: [] for row in TARGET_ROWS}
    for name, rows in all_rows.items():
        ours = [row for row in rows if row["study"] == name]
        best = min(trained(ours), key=lambda row: float(row["validation_loss"]))
        record = confirmed(name, rows)
        screen = [row for row in rows if row["study"] != name]
        whole = (sum(map(cram_flops, trained(screen))) * SCREEN if screen
                 else sum(map(cram_flops, trained(ours))) + TRIAL_FLOPS * len(stopped(ours)))
        share = spent_flops(rows) / whole
        verdict = lambda ok, text: f"{'met' if ok else 'not met'}: {text}"  # noqa: E731
        cells["best trial not a warm start"].append(verdict(
            not best["first_draw"].startswith("warm start"), best["first_draw"] or f"the controller's trial {best['trial']}"))
        if record is None or record["mismatch"]:
            for row in TARGET_ROWS[1:4]:
                cells[row].append("not confirmed")
        else:
            cells[TARGET_ROWS[1]].append(verdict(
                record["difference"].outside_noise and record["difference"].mean < 0,
                f"{interval(record['ours'].values()).text()}, paired {record['difference'].text()}"))
            multiple = record["multiple"]
            cells[TARGET_ROWS[2]].append(verdict(multiple is None or multiple >= 2,
                                                 multiple_text(multiple, record["ladder"])))
            cells[TARGET_ROWS[3]].append(verdict(record["payback"] is not None and record["payback"] <= 10,
                                                 payback_text(record)))
        cells[TARGET_ROWS[4]].append(verdict(share <= 0.6, f"{share:.0%}"))
    lines = ["| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    return "\n".join(lines + [f"| {row} | " + " | ".join(cells[row]) + " |" for row in TARGET_ROWS])


TARGET_ROWS = ("best trial not a warm start", f"winner beats {BASELINE} outside noise, 3 fresh seeds",
               "worth at least 2x its compute", "pays back within 10 final runs",
               "at most 60% of the FLOPs of every trial run to its end")


def hand_design_table(budget: str = "2e12flops") -> str:
    """The other hand designs on the confirmations' fresh seeds beside sized-cpu, strongest first:
    which hand design a winner has to beat."""
    theirs = baseline_seeds(budget)
    rows = read(CRAMS / f"{HAND_DESIGNS}.csv")
    designs = {configuration: seeds(rows, configuration, budget) for configuration in {row["configuration"] for row in rows}}
    lines = [f"| hand design | 3 fresh seeds | paired (it - {BASELINE}) |", "|---|---|---|",
             f"| {BASELINE} | {interval(theirs.values()).text()} | - |"]
    for configuration, ours in sorted(designs.items(), key=lambda item: statistics.mean(item[1].values())):
        lines.append(f"| {configuration} | {interval(ours.values()).text()} | {paired(ours, theirs).text()} |")
    return "\n".join(lines)


def early_table(all_rows: dict[str, list[dict]]) -> str:
    """Studies run with --early-stop: what ran to the end, what ASHA stopped where, the best trial,
    and the FLOPs spent against the same trials each run to its end."""
    lines = ["| study | trials run to the end | stopped early (at report: trials) | best trial | its loss "
             f"| first draw's best | controller's best | controller's trials run to the end 0.1 nats below {BASELINE} "
             "| FLOPs | share of every trial run to its end |",
             "|---|---|---|---|---|---|---|---|---|---|"]

    def loss(row: dict | None) -> str:
        return "-" if row is None else f"{float(row['validation_loss']):.3f}"

    for name, rows in all_rows.items():
        done, cut = trained(rows), stopped(rows)
        best = min(done, key=lambda row: float(row["validation_loss"]))
        first = [row for row in done if row["first_draw"]]
        own = [row for row in done if not row["first_draw"]]
        best_first = min(first, key=lambda row: float(row["validation_loss"]), default=None)
        best_own = min(own, key=lambda row: float(row["validation_loss"]), default=None)
        baseline = baseline_loss(done)
        reports = max(len(curve(row)) for row in done) + 1  # the progress reports and the final one
        at: dict[int, int] = {}
        for row in cut:
            report = round(float(row["budget_fraction"]) * reports)
            at[report] = at.get(report, 0) + 1
        full = sum(cram_flops(row) for row in done) + TRIAL_FLOPS * len(cut)
        lines.append(
            f"| {name} | {len(done)} of {len(done) + len(cut)} | {len(cut)} ("
            + ", ".join(f"{report}: {at[report]}" for report in sorted(at)) + ") "
            f"| {named(best)} | {loss(best)} | {loss(best_first)}{' (' + best_first['first_draw'] + ')' if best_first else ''} "
            f"| {loss(best_own)} | {beating(own, baseline)} "
            f"| {spent_flops(rows):.3g} | {spent_flops(rows) / full:.0%} |")
    return "\n".join(lines)


def with_screens(all_rows: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """Screened studies' trials with their screens' (`<study>-screen.csv`): what each spent in all."""
    return {name: rows + read(CRAMS / f"{name}{SCREEN_SUFFIX}.csv") for name, rows in all_rows.items()}


def best_share(rows: list[dict], screen: list[dict], promote: int) -> list[dict]:
    """The promoted trials (`rows`) that `--promote promote` keeps of a screened study that promoted
    more: those of the screen's best promoted_count(trials, promote) distinct architectures, in the
    screen's order (search.study.screen.ranked_screen), which its promotion queued first. The same
    crams as that study's: its screen does not depend on the share, and a promoted cram is its
    architecture's at the budget and the study's seed."""
    ranked = sorted(trained(screen), key=lambda row: (float(row["validation_loss"]), int(row["trial"])))
    best = set(list(dict.fromkeys(row["arch"] for row in ranked))[:promoted_count(len(screen), promote)])
    return [row for row in rows if row["arch"] in best]


def screened_table(all_rows: dict[str, list[dict]]) -> str:
    """Screened studies (search.run --screen 4): the screen at a quarter of the budget, the promoted
    best share at the budget, the best trial, where the screen ranked it, and the FLOPs against
    the same trials crammed whole and against the unscreened study of the same seed."""
    unscreened = {**studies(), **({LONG_STUDY: read(CRAMS / f"{LONG_STUDY}.csv")}
                                  if (CRAMS / f"{LONG_STUDY}.csv").is_file() else {})}
    lines = ["| study | screened at 5e11 FLOPs | screen's best | promoted to 2e12 | best trial | its loss "
             "| its place in the screen | first draw's best, promoted | controller's best, promoted "
             f"| controller's promoted trials 0.1 nats below {BASELINE} | Spearman, screen vs promoted | FLOPs "
             "| share of its trials crammed whole | share of the unscreened study |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    # sized-cpu crammed at the trial budget with the trials' seed: the same cram in every study
    baseline = baseline_loss(trained(next(iter(unscreened.values()))))

    def loss(row: dict | None) -> str:
        return "-" if row is None else f"{float(row['validation_loss']):.3f}"

    for name, rows in all_rows.items():
        screen = trained(read(CRAMS / f"{name}{SCREEN_SUFFIX}.csv"))
        promoted = trained(rows)
        by_loss = lambda group: sorted(group, key=lambda row: float(row["validation_loss"]))  # noqa: E731
        place = {row["arch"]: number for number, row in enumerate(by_loss(screen), start=1)}
        best = by_loss(promoted)[0]
        first = by_loss(row for row in promoted if row["first_draw"])
        own = [row for row in promoted if not row["first_draw"]]
        screen_loss = {row["arch"]: float(row["validation_loss"]) for row in screen}
        rho, _, _ = correlation([screen_loss[row["arch"]] for row in promoted],
                                [float(row["validation_loss"]) for row in promoted], "spearman", resamples=0)
        screened, spent = sum(map(cram_flops, screen)), sum(map(cram_flops, screen + promoted))
        twin = unscreened.get(name.replace("bracket", "default"))
        versus = f"{spent / spent_flops(twin):.0%} ({twin[0]['study']})" if twin else "-"
        lines.append(
            f"| {name} | {len(screen)} | {loss(by_loss(screen)[0])} | {len(promoted)} | {named(best)} | {loss(best)} "
            f"| {place[best['arch']]} of {len(screen)} | {loss(first[0] if first else None)}"
            f"{' (' + first[0]['first_draw'] + ')' if first else ''} | {loss(by_loss(own)[0] if own else None)} "
            f"| {beating(own, baseline)} "
            f"| {rho:.2f} | {spent:.3g} | {spent / (screened * SCREEN):.0%} | {versus} |")
    return "\n".join(lines)


def rerun_table(reruns: dict[str, list[dict]], share: dict[str, list[dict]]) -> str:
    """The promotions run again with the profile's share (`search.run ... --promote 8 --resume` on a
    copy of each real screen, studies eighth-sS) beside the crams `best_share` reads from the
    studies that promoted more: the same architectures, and their losses apart by no more than the
    CPU's arithmetic. `share`: those studies' promoted trials that `best_share` keeps, by study."""
    lines = ["| study | its screen | promoted | the same architectures as the stored share | largest loss difference "
             "| best trial | its loss | the stored share's best |", "|---|---|---|---|---|---|---|---|"]
    for name, rows in reruns.items():
        source = name.replace("eighth", "bracket")
        stored = {row["arch"]: row for row in share[source]}
        done = trained(rows)
        same = {row["arch"] for row in done} == set(stored)
        gap = max(abs(float(row["validation_loss"]) - float(stored[row["arch"]]["validation_loss"]))
                  for row in done if row["arch"] in stored)
        best = min(done, key=lambda row: float(row["validation_loss"]))
        theirs = min(stored.values(), key=lambda row: float(row["validation_loss"]))
        lines.append(f"| {name} | {source}{SCREEN_SUFFIX} | {len(done)} | {'yes' if same else 'no'} | {gap:.1e} "
                     f"| {named(best)} | {float(best['validation_loss']):.4f} | {named(theirs)}, "
                     f"{float(theirs['validation_loss']):.4f} |")
    return "\n".join(lines)


LONG_STUDY = "default-200"  # the README's 200-trial command at the same scale, seed 0
SCREENED_LONG = "bracket-200"  # the 200-trial command with --screen 4, seed 0
LEAD_STUDY = "lead-tpe-early"  # the controller benchmark's lead: --controller tpe --early-stop --trials 62, seed 0
LONG_READS = (32, 64, 100, 150, 200)


def long_table(rows: list[dict], planned: int = 200) -> str:
    """The 200-trial study read after its first 32, 64, ... trials (a prefix is what a study of that
    many trials would have found: the controller does not know the count), as far as it has run."""
    by_number = sorted((row for row in rows if row["state"] != "running"), key=lambda row: int(row["trial"]))
    cut = len(rows) - len(by_number)  # running at the export: a resume runs again what the driver's end cut short
    lines = [f"{len(by_number)} of its {planned} trials have run" + ("" if len(by_number) >= planned else
             " so far (`restore`, then `search.run --resume`, goes on): the reads below stop there")
             + (f"; {cut} more were running when it was exported (a resume runs again what was cut short)." if cut else "."),
             "",
             "| after trials | trained to the end | best trial | its loss | controller's best "
             f"| controller's trials 0.1 nats below {BASELINE} | FLOPs |", "|---|---|---|---|---|---|---|"]
    for read in [read for read in LONG_READS if read <= len(by_number)] or [len(by_number)]:
        done = trained(by_number[:read])
        if not done:  # an export before its first trial ended
            lines.append(f"| {read} | 0 | - | - | - | - | 0 |")
            continue
        best = min(done, key=lambda row: float(row["validation_loss"]))
        own = [row for row in done if not row["first_draw"]]
        best_own = min((float(row["validation_loss"]) for row in own), default=None)
        baseline = baseline_loss(done)
        flops = sum(cram_flops(row) for row in done)
        lines.append(f"| {read} | {len(done)} | {named(best)} | {float(best['validation_loss']):.3f} "
                     f"| {'-' if best_own is None else format(best_own, '.3f')} | {beating(own, baseline)} | {flops:.3g} |")
    return "\n".join(lines)


def report() -> str:
    all_rows = studies()
    sections = ["### Each study", study_table(all_rows), "### Winners confirmed", confirmation_table(all_rows)]
    if (CRAMS / f"{HAND_DESIGNS}.csv").is_file():
        sections += ["### The hand designs on the same seeds", hand_design_table()]
    sections += ["### Rungs: how well a progress report ranks the end", rung_table(all_rows),
                 "### ASHA replayed with other rungs", replay_table(all_rows)]
    early = studies("early")
    if early:
        sections += [f"### With --early-stop (grace {ASHA['grace_reports']}, reduction {ASHA['reduction_factor']})",
                     early_table(early), "### Their winners confirmed", confirmation_table(early)]
    long_rows = {LONG_STUDY: read(CRAMS / f"{LONG_STUDY}.csv")} if (CRAMS / f"{LONG_STUDY}.csv").exists() else {}
    if long_rows:
        sections += [f"### The 200-trial study ({LONG_STUDY})", long_table(long_rows[LONG_STUDY])]
        if (CRAMS / f"{LONG_STUDY}-confirm.csv").exists():
            sections += ["### Its winner confirmed", confirmation_table(long_rows)]
    screened = {**studies("bracket"), **({SCREENED_LONG: read(CRAMS / f"{SCREENED_LONG}.csv")}
                                         if (CRAMS / f"{SCREENED_LONG}.csv").is_file() else {})}
    if screened:
        sections += [f"### Screened: --screen {SCREEN} --promote {PROMOTED}, as they ran", screened_table(screened),
                     "### Their winners confirmed", confirmation_table(with_screens(screened)),
                     "### Issue 38's target", target_table(with_screens(screened))]
        share = {name: best_share(rows, read(CRAMS / f"{name}{SCREEN_SUFFIX}.csv"), DEFAULT_PROMOTE)
                 for name, rows in screened.items()}
        sections += [f"### Screened: --screen {SCREEN} --promote {DEFAULT_PROMOTE}, the CPU profile's default: "
                     "the same studies' promotions of their screen's best share", screened_table(share),
                     "### Their winners confirmed", confirmation_table(with_screens(share)),
                     "### Issue 38's target", target_table(with_screens(share))]
        reruns = {name: rows for name, rows in studies("eighth").items() if name.replace("eighth", "bracket") in screened}
        if reruns:
            sections += [f"### The promotions run again with --promote {DEFAULT_PROMOTE}", rerun_table(reruns, share)]
    fresh = studies("fresh")
    if fresh:
        sections += ["### A seed no earlier study ran, with today's defaults (fresh-sS)", screened_table(fresh),
                     "### Its winner confirmed", confirmation_table(with_screens(fresh)),
                     "### Issue 38's target", target_table(with_screens(fresh))]
    unscreened = {**all_rows, **long_rows}
    if unscreened:
        sections += ["### Issue 38's target, every trial crammed whole (--screen 1)", target_table(unscreened)]
    if (CRAMS / f"{LEAD_STUDY}.csv").exists():
        lead_rows = {LEAD_STUDY: read(CRAMS / f"{LEAD_STUDY}.csv")}
        sections += [f"### TPE with --early-stop at 62 trials ({LEAD_STUDY})", early_table(lead_rows)]
        if (CRAMS / f"{LEAD_STUDY}-confirm.csv").exists():
            sections += ["### Its winner confirmed", confirmation_table(lead_rows)]
    return "\n\n".join(sections)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="one study's trials (and its confirmations) into benchmarks/crams/, "
                                 "and its Optuna records for `restore`")
    export.add_argument("--study", required=True)
    export.add_argument("--storage", required=True, help="its Optuna storage, e.g. sqlite:///optuna.db")
    export.add_argument("--tracking-uri", help="its MLflow store, for search.confirm's runs")
    crams = commands.add_parser("export-crams", help="trainer.cram run directories into benchmarks/crams/<name>.csv")
    crams.add_argument("--name", required=True)
    crams.add_argument("--configuration", required=True, help="what was crammed, e.g. sized-cpu")
    crams.add_argument("runs", nargs="+")
    restore = commands.add_parser("restore", help="a kept study into an Optuna storage, for search.run --resume")
    restore.add_argument("--study", required=True)
    restore.add_argument("--storage", required=True, help="where search.run will resume it, e.g. sqlite:///optuna.db")
    restore.add_argument("--as", dest="to_name", help="under this name instead, a study of its own")
    commands.add_parser("report", help="the tables, from benchmarks/crams/ alone")
    args = parser.parse_args(argv)
    if args.command == "export":
        for path in export_study(args.study, args.storage, args.tracking_uri):
            print(f"wrote {path}")
    elif args.command == "restore":
        restore_study(args.study, args.storage, to_name=args.to_name)
        print(f"restored {args.study} into {args.storage}{f' as {args.to_name}' if args.to_name else ''}; continue "
              f"it with  python -m search.run --study {args.to_name or args.study} --resume ... (the flags it was "
              "started with)")
    elif args.command == "export-crams":
        print(f"wrote {export_crams(args.name, args.configuration, args.runs)}")
    else:
        print(report())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
