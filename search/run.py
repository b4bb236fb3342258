"""`python -m search.run --trials 200`: an architecture search study on Ray Tune.

Everything is checked before the first trial (space, budget, flags, data, GLUE tasks, tracking
store); the data and tokenizer are prepared once, here, and every trial reads the cache. The
study lives in two stores that agree trial for trial: the Optuna study (the controller's memory)
and MLflow (what people look at). `--resume` continues a study to its requested total after
Ctrl-C or a killed driver.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from search.base.paths import CONFIGS, PROFILES, SPACES
from search.study.resources import auto_cpus_per_trial, local_gpus
from space.errors import CramnasError, UsageError
from trainer.console import VERBOSE_HELP, CliParser, one_line_on_ctrl_c, quiet_libraries
from trainer.data_flags import add_data_arguments

if TYPE_CHECKING:  # imported for real only after the flags are checked (torch, Ray, Optuna: seconds)
    from search.base.objectives import Objective
    from search.study.spec import StudyPlan
    from space.search_space import SearchSpace
    from trainer.budget import Budget
    from trainer.config import TrainConfig
    from trainer.data import PretrainData



def build_parser() -> CliParser:
    """The command line of `python -m search.run` (docs/cli.md is generated from it: docs/gen_cli.py)."""
    from search.base.objectives import OBJECTIVES
    from search.study.controllers import CONTROLLERS, DEFAULT_CONTROLLER

    parser = CliParser(prog="python -m search.run", description="Search crammed BERT architectures.")
    parser.add_argument("--trials", type=int, default=200, help="trials in the study, in total (resume included)")
    parser.add_argument("--controller", default=DEFAULT_CONTROLLER, choices=sorted(CONTROLLERS),
                        help="the Optuna sampler that picks each next architecture (search/study/controllers.py says "
                             "why gp is the default)")
    parser.add_argument("--space", help="search-space YAML (default: the device profile's)")
    parser.add_argument("--budget", help="per-trial budget: 60s, 5m, 2e7tokens, 1e15flops, 180refs, cramming-day ... "
                        "(default: the profile's)")
    parser.add_argument("--objective", choices=sorted(OBJECTIVES), help="default: the profile's (cpu: mlm, gpu: probe)")
    parser.add_argument("--study", help="study name (default: generated and printed)")
    parser.add_argument("--resume", action="store_true", help="continue --study to --trials")
    parser.add_argument("--max-concurrent", type=int, help="trials at once (default: what the resources allow)")
    parser.add_argument("--gpus-per-trial", type=float,
                        help="GPUs each trial holds, 0.5 for two trials on a GPU (default: the profile's "
                             "resources.gpus_per_trial: cpu 0, gpu 1)")
    parser.add_argument("--cpus-per-trial", type=float,
                        help="CPU cores each trial holds (default: the profile's resources.cpus_per_trial: cpu 1, "
                             "gpu auto, the node's CPUs per GPU up to 8)")
    parser.add_argument("--executor", choices=("ray", "local"), default="ray",
                        help="who runs the trials: ray (Ray Tune, on this machine or with --address a cluster) or "
                             "local (this machine's own processes, without Ray: same trials, records, resume and "
                             "early stopping)")
    parser.add_argument("--address", help="join a Ray cluster: auto or HOST:PORT (default: start Ray locally)")
    parser.add_argument("--tracking-uri", help="MLflow store (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    parser.add_argument("--storage", help="Optuna study storage (default: optuna.db beside a SQLite MLflow store)")
    add_data_arguments(parser)
    stopping = parser.add_mutually_exclusive_group()
    stopping.add_argument("--early-stop", dest="early_stop", action="store_true", default=None,
                          help="ASHA over each trial's progress reports, with the profile's rungs (default: the "
                               "profile's early_stop.by_default, off in cpu and gpu: benchmarks/RESULTS.md, "
                               "\"The study a user runs\")")
    stopping.add_argument("--no-early-stop", dest="early_stop", action="store_false",
                          help="no ASHA: every trial runs its full budget (the default)")
    parser.add_argument("--screen", type=int, metavar="N",
                        help="a screened study: every trial crammed whole at 1/N of --budget (study NAME-screen), "
                             "then the best of them (--promote) at --budget (study NAME, which export and confirm read); "
                             "search/study/screen.py. 1: off (default: the profile's screen.factor from its "
                             "screen.min_trials trials, 4 from 20 in cpu, off in gpu; off with --early-stop; on "
                             "--resume, what the study was started with)")
    parser.add_argument("--promote", type=int, metavar="M",
                        help="a screened study promotes the best 1/M of its screen to --budget (default: the "
                             "profile's screen.promote, 8 in cpu, else N of --screen; on --resume, what the study "
                             "was started with)")
    parser.add_argument("--no-probe", action="store_true", help="skip the GLUE probe (objective mlm only)")
    parser.add_argument("--save-checkpoints", action="store_true",
                        help="write each trial's trained model to checkpoints/<study>/t0007/ beside the MLflow "
                             "store (tag cramnas.checkpoint)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the controller and the covering design: the same seed and flags propose the "
                             "same architectures (each trial trains with the run config's train.seed)")
    parser.add_argument("--warm-start", default="profile", metavar="profile|none|study:NAME[:K]",
                        help="a new study's first trials: the profile's hand designs (default), none, or the top K "
                             "(default 5) trials of an earlier study in the same storage; a covering design that "
                             "trains every value of every choice follows (search/study/warm_start.py)")
    parser.add_argument("--no-cover", action="store_true",
                        help="no covering design: the controller draws from the first trial after the warm starts")
    parser.add_argument("--estimate", action="store_true",
                        help="check the flags, print what the study would cost in device-hours, and exit")
    parser.add_argument("--ladder", help="the promotion ladder you will climb after the study (search.confirm "
                                         "--ladder, e.g. 3x,9x,27x): --estimate prices it, and the next steps name it")
    parser.add_argument("--target", help="the same for search.confirm --target, e.g. 30x or 6e13flops")
    parser.add_argument("--profile", help="device profile: cpu, gpu or a profile YAML (default: gpu if CUDA is present)")
    parser.add_argument("--verbose", action="store_true", help=VERBOSE_HELP)
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def _beside(profile: Path, name: str, default_dir: Path) -> Path:
    """A file a profile names: next to the profile if it is there, else in the default directory."""
    local = profile.parent / name
    return local if local.is_file() else default_dir / name


def trial_train(profile: dict[str, Any], profile_path: Path) -> TrainConfig:
    """The training settings every trial of a profile runs: its run config's, under the profile's own `train`."""
    from trainer.config import TrainConfig, load_run_config

    run = load_run_config(_beside(profile_path, profile["run_config"], CONFIGS))
    return TrainConfig.from_dict({**run.train.to_dict(), **profile.get("train", {})}, where=f"{profile_path.name}: train")


def default_profile() -> str:
    import torch

    return "gpu" if torch.cuda.is_available() else "cpu"


# ASHA stops trials against the rungs of those before them: in a study of fewer trials it would stop
# nearly all of them (7 of 8 in a short look at 2e12 FLOPs) and leave too few complete to compare.
# A profile's early_stop.min_trials overrides it.
ASHA_MIN_TRIALS = 20

PROFILE_KEYS = {"space": str, "run_config": str, "budget": str, "probe": dict, "resources": dict, "early_stop": dict}


def load_profile(path: Path) -> dict[str, Any]:
    """A device profile (search/profiles/*.yaml), its keys checked so that a gap is one line, not a KeyError."""
    fix = f"see {PROFILES / 'cpu.yaml'} for a complete profile"
    try:
        profile = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise UsageError(f"--profile: {path.name} is not valid YAML ({problem}{where}); {fix}") from None
    if not isinstance(profile, dict):
        raise UsageError(f"--profile: {path.name} must be a mapping of settings; {fix}")
    for key, kind in PROFILE_KEYS.items():
        if not isinstance(profile.get(key), kind):
            raise UsageError(f"--profile: {path.name} needs {key} ({kind.__name__}), got {profile.get(key)!r}; {fix}")
    for section, keys in (("probe", ("tasks", "limits")), ("resources", ("cpus_per_trial", "gpus_per_trial")),
                          ("early_stop", ("by_default", "grace_reports", "reduction_factor"))):
        missing = [key for key in keys if key not in profile[section]]
        if missing:
            raise UsageError(f"--profile: {path.name}: {section} lacks {', '.join(missing)}; {fix}")
    if not isinstance(profile["early_stop"]["by_default"], bool):
        raise UsageError(f"--profile: {path.name}: early_stop.by_default must be true or false, got "
                         f"{profile['early_stop']['by_default']!r}; {fix}")
    min_trials = profile["early_stop"].get("min_trials", ASHA_MIN_TRIALS)
    if not isinstance(min_trials, int) or isinstance(min_trials, bool) or min_trials < 1:
        raise UsageError(f"--profile: {path.name}: early_stop.min_trials must be a whole number of trials, at least "
                         f"1, got {min_trials!r}; {fix}")
    screen = profile.setdefault("screen", {"factor": 1})
    if not isinstance(screen, dict) or "factor" not in screen:
        raise UsageError(f"--profile: {path.name}: screen must be a mapping with a factor (1: off), such as "
                         f"{{factor: 4, promote: 8, min_trials: 20}}, got {screen!r}; {fix}")
    for key, least in (("factor", 1), ("promote", 1), ("min_trials", 1)):
        value = screen.get(key, least)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise UsageError(f"--profile: {path.name}: screen.{key} must be a whole number, at least {least}, got "
                             f"{value!r}; {fix}")
    if not isinstance(profile.get("train", {}), dict):
        raise UsageError(f"--profile: {path.name}: train must be a mapping of training settings; {fix}")
    return profile


def check_local_resources(resources: dict[str, float]) -> None:
    """A local Ray never places a trial that asks for more than this machine has: the study would
    wait forever. (A cluster may have more, so `--address` skips this.)"""
    have = {"cpu": os.cpu_count() or 1, "gpu": local_gpus() if resources["gpu"] > 0 else 0}
    for kind, amount in resources.items():
        if amount > have[kind]:
            raise UsageError(f"--{kind}s-per-trial: a trial asks for {amount:g} {kind.upper()}s but this machine has "
                             f"{have[kind]}; ask for at most {have[kind]} with --{kind}s-per-trial, or join a "
                             "cluster with --address")


def repeat_warning_for_study(budget: Budget, space: SearchSpace, train: TrainConfig, data: PretrainData,
                             trial_gpus: float = 0) -> str | None:
    """One line when a trial's budget would read the prepared corpus more than once (every trial
    reads it in the same order from the start), judged on the cheapest of 64 random draws of the
    space: a FLOP budget gives it the most tokens, and it is the fastest (in reference-core
    seconds, the cheapest is the fastest on the reference core). A wall-clock budget times
    that architecture here (a few passes, seconds) on the kind of device the trials get
    (`trial_gpus`): on the CPU for CPU trials, so that the driver leaves no CUDA context on GPU 0
    beside them. On a cluster whose trials run on faster devices than the driver's, the warning
    can come too late or not at all."""
    import functools
    import random

    from space.arch import ArchConfig
    from trainer.budget import reference_core
    from trainer.epochs import corpus_tokens, repeat_warning

    rng = random.Random(0)
    if budget.is_reference_core:
        cost = functools.partial(reference_core().seconds_per_token, mlm_rate=train.mlm_rate)
    else:
        cost = functools.partial(ArchConfig.flops_per_token, seq_len=data.seq_len, mlm_rate=train.mlm_rate)
    cheapest = min((space.sample_random(rng) for _ in range(64)), key=cost)
    budget = budget.resolve(cheapest, train.mlm_rate)
    flops = cheapest.flops_per_token(data.seq_len, train.mlm_rate)
    speed = None
    if budget.is_wall_clock:
        import torch

        from trainer.device import pick_device
        from trainer.epochs import measure_speed
        from trainer.model import CrammedBert

        device = pick_device() if trial_gpus > 0 else torch.device("cpu")
        speed = measure_speed(CrammedBert(cheapest).to(device), data, train.mlm_rate, train.micro_batch, device)
    warning = repeat_warning(budget, corpus_tokens(data), flops, speed)
    return None if warning is None else f"{warning} (per trial)"


def check_storage(storage: str, flag: str = "--storage (or $CRAMNAS_STUDY_STORAGE)") -> str:
    """Open the Optuna storage now: a bad URL fails before the data is prepared, in one line that
    names the `flag` it came from."""
    import optuna

    from search.tracking.retry import first_line

    try:
        optuna.storages.get_storage(storage)
    except Exception as error:  # noqa: BLE001 - SQLAlchemy's errors for a bad URL, driver or file
        raise UsageError(f"{flag}: cannot open {storage} ({first_line(error)}); pass an "
                         "SQLAlchemy URL such as sqlite:///optuna.db") from None
    return storage


@dataclass
class CheckedInputs:
    """The flags and the profile, checked (`check_inputs`): what a study and its estimate need
    before any data is prepared or any store is opened."""

    profile_path: Path
    profile: dict[str, Any]
    objective: Objective
    space: SearchSpace
    space_path: Path
    budget: Budget
    train: TrainConfig
    resources: dict[str, float | None]  # cpu None: `auto` on a cluster, resolved once Ray is up (search.study.driver)
    source: Any  # trainer.corpus.CorpusSource
    probe: Any  # search.study.spec.Probe, None with --no-probe
    early_stop: dict[str, Any] | None
    ladder: Any = None  # search.analysis.ladder.Ladder of --ladder or --target, None without
    screen: int = 1  # --screen, else the profile's: 1 for an unscreened study
    promote: int = 1  # --promote, else the profile's: a screened study promotes the best 1/promote of its screen


def check_inputs(args: argparse.Namespace) -> CheckedInputs:
    """Check the flags, the profile and the local resources; raises UsageError (or a library's
    one-line error). Cheapest first: flags, profile, space, budget and training settings are
    checked before torch, datasets or MLflow are even imported, so a typo fails in a second."""
    from search.base.objectives import OBJECTIVES
    from search.study import controllers
    from search.study.spec import Probe
    from search.study.warm_start import parse_spec
    from space import load_space
    from trainer.budget import Budget

    if args.trials < 1:
        raise UsageError(f"--trials: must be at least 1, got {args.trials}")
    if args.resume and not args.study:
        raise UsageError("--resume: needs --study NAME (the study to continue)")
    if args.max_concurrent is not None and args.max_concurrent < 1:
        raise UsageError(f"--max-concurrent: must be at least 1, got {args.max_concurrent}")
    if args.address and args.executor == "local":
        raise UsageError("--address: joins a Ray cluster, which --executor local does not use; drop --address, or "
                         "pass --executor ray")
    if args.screen is not None and args.screen < 1:
        raise UsageError(f"--screen: must be at least 1 (1: off), got {args.screen}")
    if args.promote is not None and args.promote < 1:
        raise UsageError(f"--promote: must be at least 1 (1: every screened trial), got {args.promote}")
    if args.seed < 0:  # Optuna's samplers take seeds in [0, 2**32)
        raise UsageError(f"--seed: must not be negative, got {args.seed}")
    for flag, amount in (("--cpus-per-trial", args.cpus_per_trial), ("--gpus-per-trial", args.gpus_per_trial)):
        if amount is not None and amount < 0:
            raise UsageError(f"{flag}: must not be negative, got {amount:g}")
    if os.environ.get("CRAMNAS_INJECT_FAULT"):  # a typo would inject nothing, silently
        from search.study.trial import parse_faults

        parse_faults(os.environ["CRAMNAS_INJECT_FAULT"])
    profile_path = Path(args.profile) if args.profile and args.profile.endswith(".yaml") else \
        PROFILES / f"{args.profile or default_profile()}.yaml"
    if not profile_path.is_file():
        raise UsageError(f"--profile: {args.profile!r} is neither cpu, gpu nor an existing profile YAML")
    profile = load_profile(profile_path)
    args.objective = args.objective or profile.get("objective", "probe")
    objective = OBJECTIVES[args.objective]
    if args.no_probe and objective.needs_probe:
        raise UsageError(f"--no-probe: the objective {args.objective!r} needs the probe; use --objective mlm")

    space_path = Path(args.space) if args.space else _beside(profile_path, profile["space"], SPACES)
    space = load_space(space_path)
    controllers.make_sampler(args.controller, args.objective, space, args.seed)  # controller x objective fit
    parse_spec(args.warm_start)
    budget = Budget.parse(args.budget or profile["budget"])
    train = trial_train(profile, profile_path)
    resources = {"cpu": args.cpus_per_trial if args.cpus_per_trial is not None else profile["resources"]["cpus_per_trial"],
                 "gpu": args.gpus_per_trial if args.gpus_per_trial is not None else profile["resources"]["gpus_per_trial"]}
    if resources["cpu"] == "auto":  # an estimate prices this machine's trials, even with --address
        resources["cpu"] = None if args.address and not args.estimate else \
            auto_cpus_per_trial(os.cpu_count() or 1, local_gpus() if resources["gpu"] > 0 else 0, resources["gpu"])
    for kind in ("cpu", "gpu"):
        if resources[kind] is not None and (isinstance(resources[kind], bool) or
                                            not isinstance(resources[kind], (int, float)) or resources[kind] < 0):
            raise UsageError(f"--profile: {profile_path.name}: resources.{kind}s_per_trial must be a number of at least "
                             f"0{' or auto' if kind == 'cpu' else ''}, got {resources[kind]!r}")
    if not any(resources.values()) and resources["cpu"] is not None:
        raise UsageError("--cpus-per-trial: a trial needs a CPU or a GPU, got 0 of each; pass --cpus-per-trial 1")
    if not args.address and not args.estimate:  # an estimate may price a GPU study on a laptop
        check_local_resources(resources)

    from glue.data import resolve_tasks, why_unavailable
    from trainer.corpus import CorpusSource

    if args.data:  # Ray workers run in another working directory: give them the absolute path
        args.data = str(Path(args.data).resolve())
    # Files found (or a hub id taken) now; read and tokenised below.
    # Without --data or --corpus, GPU trials stream a corpus they cannot exhaust (trainer/corpus.py).
    source = CorpusSource.from_args(data_dir=args.data, corpus=args.corpus, gpu=resources["gpu"] > 0)
    probe = None
    if not args.no_probe:
        spec = profile["probe"]["tasks"]  # names checked here, their files below (one line naming the profile)
        tasks = resolve_tasks(spec, args.data if spec == "available" else None)
        for task in tasks if args.data else ():
            reason = why_unavailable(task, args.data)
            if reason is not None:
                raise UsageError(f"--data: the probe's GLUE task {task.name} ({profile_path.name}: probe.tasks): "
                                 f"{reason}; add it, drop it from probe.tasks, or pass --no-probe --objective mlm")
        probe = Probe(tuple(task.name for task in tasks), {**profile["probe"]["limits"], "data_dir": args.data})
    screen, promote = study_screen(args, profile)
    if screen == 1 and args.promote is not None:
        raise UsageError("--promote: only a screened study promotes, and this one is not (--screen 1); pass --screen N "
                         "too, or drop --promote")
    if screen > 1 and args.early_stop:
        raise UsageError(f"--early-stop: a screened study (--screen {screen}) crams every trial whole at its budget; "
                         "drop --early-stop, or pass --screen 1")
    wanted = profile["early_stop"]["by_default"] if args.early_stop is None else args.early_stop
    early_stop = None if not wanted or objective.multi else {"min_trials": ASHA_MIN_TRIALS, **profile["early_stop"]}
    ladder = None
    if args.ladder is not None or args.target is not None:
        from search.analysis import ladder as ladders

        # As search.confirm would read them, with its defaults.
        ladders.check_flags(argparse.Namespace(ladder=args.ladder, target=args.target, eta=None, budget=None,
                                               top=ladders.LADDER_TOP))
        ladder = ladders.ladder_of(argparse.Namespace(ladder=args.ladder, target=args.target, eta=None), budget)
    return CheckedInputs(profile_path, profile, objective, space, space_path, budget, train, resources, source, probe,
                         None if screen > 1 else early_stop, ladder, screen, promote)


def study_screen(args: argparse.Namespace, profile: dict[str, Any]) -> tuple[int, int]:
    """The study's screen factor (search.study.screen; 1: unscreened) and the share it promotes
    (the best 1/promote): --screen and --promote; else, resumed, what its stores say it was started
    with; else none where --early-stop asks for ASHA; else the profile's factor from its min_trials
    trials (a short look of the first draw is not screened: at a quarter of the budget its trials are
    all on the plateau, benchmarks/RESULTS.md) and its promote, or the factor where it sets none."""
    if args.screen is not None and args.promote is not None:
        return args.screen, args.promote
    setting = profile["screen"]
    stored = None
    if args.resume:
        from search.study.screen import stored_screen
        from search.tracking.stores import study_storage

        stored = stored_screen(args.study, check_storage(study_storage(args.tracking_uri, args.storage)))
    if args.screen is not None:
        factor = args.screen
    elif stored is not None:
        factor = stored[0]
    elif args.early_stop:
        factor = 1
    else:
        factor = setting["factor"] if args.trials >= setting.get("min_trials", 1) else 1
    if args.promote is not None:
        return factor, args.promote
    if stored is not None and stored[0] == factor:
        return stored
    return factor, setting.get("promote", factor) if factor > 1 else 1


def default_study_name(controller: str) -> str:
    return f"cramnas-{controller}-{time.strftime('%Y%m%d-%H%M%S')}"


def make_plan(args: argparse.Namespace, checked: CheckedInputs | None = None) -> StudyPlan:
    """Check every input (`check_inputs`), open the stores and prepare the data, last; raises
    UsageError (or a library's one-line error). A screened study's promotion stage
    (`screened_stages`) opens its study with the screen's best queued."""
    import optuna

    from search.study import controllers
    from search.study.spec import StudyPlan, TrialSpec
    from search.study.warm_start import warm_starts
    from search.tracking.stores import check_store, checkpoint_dir, study_storage
    from trainer.data import prepare_data, tokens_to_prepare

    checked = checked or check_inputs(args)  # `main` checked an unscreened study's flags already
    space, budget, train, source, probe = checked.space, checked.budget, checked.train, checked.source, checked.probe
    tracking_uri = check_store(args.tracking_uri)  # $MLFLOW_TRACKING_URI or sqlite:///mlflow.db by default
    storage = check_storage(study_storage(tracking_uri, args.storage))
    warm = [] if args.resume else warm_starts(args.warm_start, checked.profile, space, storage,
                                               warn=lambda line: print(line, file=sys.stderr))
    fixed = space.fixed
    data = prepare_data(source, vocab_size=fixed.get("vocab_size", 32768),
                        seq_len=fixed.get("max_seq_len", 128), cache_dir=args.cache_dir,
                        max_tokens=tokens_to_prepare(source, budget))

    warning = repeat_warning_for_study(budget, space, train, data, checked.resources["gpu"])
    if warning is not None:
        print(warning, file=sys.stderr)

    study = args.study or default_study_name(args.controller)
    checkpoints = None
    if args.save_checkpoints:
        checkpoints = checkpoint_dir(tracking_uri, study)
        try:
            checkpoints.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise UsageError(f"--save-checkpoints: cannot create {checkpoints} ({error.strerror}); "
                             "run from a writable directory or pass --tracking-uri sqlite:///<writable>/mlflow.db") from None
    template = TrialSpec(train, budget, data.fingerprint, data_dir=args.data, corpus=source.hub_id,
                         cache_dir=str(Path(args.cache_dir).resolve()) if args.cache_dir else None, probe=probe,
                         checkpoint_dir=str(checkpoints) if checkpoints else None)
    promote_from = getattr(args, "promote_from", None)  # set by `screened_stages` only
    # A screened study resumed before its promotion began: the promotion's study is new.
    resume = args.resume and (promote_from is None or study in optuna.study.get_all_study_names(storage))
    # Last, once everything else is known good: creates the study, or reopens it to resume.
    optuna_study = controllers.open_study(study, storage, args.controller, args.objective, space, args.seed,
                                          resume, warm_starts=warm, cover=not args.no_cover, trials=args.trials,
                                          early_stop=checked.early_stop is not None)
    if promote_from is not None:
        from search.study.screen import promote

        queued = promote(optuna_study, optuna.load_study(study_name=promote_from, storage=storage), space, args.trials)
        if queued:
            print(f"promoted to {budget.text}: the screen's trials {', '.join(map(str, queued))}, best first "
                  f"(study {promote_from})")
    return StudyPlan(study, optuna_study, resume, args.trials, args.controller, checked.objective, space,
                checked.space_path, budget, template, checked.resources, args.max_concurrent, checked.early_stop,
                tracking_uri, storage, args.address, args.seed, args.executor, unigram_floor=data.unigram_floor,
                corruption_floor=data.corruption_floor, context_reference=data.context_reference,
                resume_flags=getattr(args, "resume_flags", None))


def screened_stages(args: argparse.Namespace, checked: CheckedInputs) -> list[argparse.Namespace]:
    """A screened study's two stages as the flags of two studies (search.study.screen): the screen,
    every trial at 1/N of the budget, then the promotion of its best 1/N at the budget, with no
    draw of its own; one study's flags, unchanged, for an unscreened study."""
    if checked.screen == 1:
        return [args]
    from search.study.screen import promoted_count, screen_budget, screen_name

    study = args.study or default_study_name(args.controller)
    shared = {"early_stop": False, "screen": checked.screen, "promote": checked.promote,
              "resume_flags": f"--study {study} --screen {checked.screen} --promote {checked.promote} --resume "
                              f"--trials {args.trials}"}
    screen = argparse.Namespace(**{**vars(args), **shared, "study": screen_name(study),
                                   "budget": screen_budget(checked.budget, checked.screen).text})
    promotion = argparse.Namespace(**{**vars(args), **shared, "study": study, "budget": checked.budget.text,
                                      "trials": promoted_count(args.trials, checked.promote), "warm_start": "none",
                                      "no_cover": True, "promote_from": screen.study})
    return [screen, promotion]


def run_stages(stages: list[argparse.Namespace], checked: CheckedInputs) -> int:
    """Run the study (a screened study: its screen, then its promotion, each checked with its own
    flags); the next steps after the last."""
    from search.base import attrs
    from search.study.driver import run_study
    from search.study.next_steps import print_after_search

    if len(stages) > 1:
        screen, promotion = stages
        print(f"screened study (--screen {checked.screen} --promote {checked.promote}; --screen 1 crams every trial "
              f"whole): {screen.trials} trials at {screen.budget} in study {screen.study}, then the best "
              f"{promotion.trials} at {promotion.budget} in study {promotion.study}")
    for stage in stages:
        plan = make_plan(stage, checked if len(stages) == 1 else None)
        if len(stages) > 1 and stage is stages[0]:  # what a resume without --screen reads (study_screen)
            plan.optuna_study.set_user_attr(attrs.SCREEN, checked.screen)
            plan.optuna_study.set_user_attr(attrs.PROMOTE, checked.promote)
        code = run_study(plan)
        if code:
            return code
    if checked.screen > 1:
        import optuna

        from search.study.screen import spent_line

        print(spent_line(optuna.load_study(study_name=stages[0].study, storage=plan.storage), plan.optuna_study,
                         checked.screen))
    return print_after_search(plan, 0)


@one_line_on_ctrl_c
def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quiet_libraries(args.verbose)
    if not args.address:  # keep a local Ray on loopback (docs/stack.md); a cluster user runs without it
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # Records go to MLflow and the study; Ray's own result loggers and status tables are noise here.
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    # A failed or repeated trial's one report has no training loss for ASHA; it ends the trial anyway.
    os.environ.setdefault("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    # MLflow's own HTTP retries (7, backing off up to 2 minutes each) would make every write to a
    # stopped tracking server take minutes and could replay a create; search.tracking.retry.Retry retries.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
    import optuna

    try:  # before search.study.driver imports Ray: a bad input fails before any of that loads
        checked = check_inputs(args)
        stages = screened_stages(args, checked)
        if args.estimate:
            from search.study.estimate import study_estimate

            for stage in stages:
                if len(stages) > 1:
                    print(f"{'screen' if stage is stages[0] else 'promotion'}, study {stage.study}:")
                staged = checked if len(stages) == 1 else check_inputs(stage)
                print(study_estimate(staged, stage.trials, args.max_concurrent, args.controller).text())
            return 0
        return run_stages(stages, checked)
    # Every cramnas user error is a CramnasError (SpaceError, BudgetError, ConfigError, DataError,
    # GlueError, TrackingError, UsageError); Optuna's for a study another driver created meanwhile.
    except (CramnasError, optuna.exceptions.DuplicatedStudyError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
