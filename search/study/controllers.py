"""Controllers: which architecture to train next, and the study that remembers what was trained.

Every controller is an Optuna study with a sampler from `CONTROLLERS`, so `--controller` is a dict
lookup and the study's storage is the one persistent record of the search:

    study = open_study("s1", DEFAULT_STORAGE, "evolution", "probe", space, seed=0, resume=False,
                       warm_starts=hand_designs("cpu"), cover=True)   # search.study.warm_start
    proposal = ask(study, space)                 # a new trial and the ArchConfig it stands for
    if proposal.repeat_of is not None:           # trained before: tell the recorded values
        tell(study, proposal.number, study.trials[proposal.repeat_of].values)
    else:
        tell(study, proposal.number, OBJECTIVES["probe"].values(metrics), intermediate=curve)

(`OBJECTIVES` is `search.base.objectives`'; the state names `tell` takes are `search.base.states`'.)

Resume is `open_study(..., resume=True)`, `fail_stale_running(study)`, then
`rerun_cut_short(study, remaining)`: samplers rebuild from the stored trials, and
`RegularizedEvolutionSampler` keeps no state beyond them, so it continues exactly; the trials the
dead driver left running are failed and their architectures queued to be asked again. Storage is
an Optuna URL (default SQLite next to MLflow's `mlflow.db`) or any Optuna storage object, e.g. a
`JournalStorage`; `None` keeps the study in memory.
"""

from __future__ import annotations

import logging
import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.storages import BaseStorage
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from search.base import attrs
from search.base.objectives import OBJECTIVES
from search.base.states import COMPLETE, FAILED, FINISHED_STATES, REPEAT, STATES, state_of_trial
from search.study.stopped import SeesStoppedTrials
from space import ArchConfig, OptunaDraws, SearchSpace, mutate
from space.errors import CramnasError

__all__ = [
    "CONTROLLERS", "DEFAULT_STORAGE", "DRIVER_DIED", "Controller", "Proposal", "RegularizedEvolutionSampler", "ask",
    "fail_stale_running", "is_cut_short", "make_sampler", "open_study", "rerun_cut_short", "study_counts", "tell",
]

_logger = logging.getLogger(__name__)

# SQLite beside MLflow's default `sqlite:///mlflow.db`: one more file in the working directory,
# readable by `optuna-dashboard` and plain SQL; any other RDB URL (PostgreSQL on a cluster) works
# unchanged. It is the slower store: an ask + tell here (a write per parameter) took ~0.3 s on a
# loaded 2-core machine against ~0.09 s for a journal file, which is noise next to trials that
# train for a minute or more; and only the driver writes to it.
DEFAULT_STORAGE = "sqlite:///optuna.db"

# Evolutionary controllers (evolution, nsga2) breed from 20 members: studies here run 100-300
# trials, so Optuna's NSGA-II default of 50 would spend a sixth to a half of them on its random
# first generation.
POPULATION_SIZE = 20
# Real et al. (2019) sampled S=25 of P=100; keep their ratio.
TOURNAMENT_SIZE = 5


# ---- regularized evolution --------------------------------------------------------------------

class RegularizedEvolutionSampler(BaseSampler):
    """Aging evolution (Real et al. 2019, "Regularized Evolution for Image Classifier Architecture
    Search") as an Optuna sampler.

    Until the study has `population_size` COMPLETE trials, each trial is a random member of the
    space (generation 0). After that the population is the `population_size` most recently
    completed trials, so the oldest die whatever their score; each new trial draws `sample_size`
    of them at random, takes the best by the study's objective, and is `mutate(parent)`.

    The whole child is decided in `before_trial` and handed out parameter by parameter from
    `sample_independent`. Each trial's randomness is seeded by (seed, trial number) and the
    population is read from the stored trials (their `arch` user attribute, which `ask` sets), so
    the sampler holds no state beyond the storage and a resumed study continues exactly.
    Single-objective only.
    """

    def __init__(self, space: SearchSpace, population_size: int = POPULATION_SIZE,
                 sample_size: int = TOURNAMENT_SIZE, seed: int | None = None) -> None:
        if not 1 <= sample_size <= population_size:
            raise ValueError(f"sample_size: need 1 <= sample_size <= population_size={population_size}, "
                             f"got {sample_size}")
        self.space = space
        self.population_size = population_size
        self.sample_size = sample_size
        self._seed = random.randrange(2**32) if seed is None else seed
        self._children: dict[int, ArchConfig] = {}  # trial number -> its config, while it is asked

    def population(self, study: optuna.Study) -> list[FrozenTrial]:
        """The most recently completed trials, at most `population_size`, oldest first."""
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        complete.sort(key=lambda t: (t.datetime_complete, t.number))
        return complete[-self.population_size:]

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if len(study.directions) > 1:
            raise ValueError("controller evolution: regularized evolution is single-objective; "
                             "use nsga2 for several objectives")
        rng = random.Random(f"{self._seed}:{trial.number}")
        population = self.population(study)
        if len(population) < self.population_size:
            child = self.space.sample_random(rng)
            lineage: dict[str, Any] = {attrs.GENERATION: 0}
        else:
            # With replacement, as in the paper's pseudocode.
            tournament = [rng.choice(population) for _ in range(self.sample_size)]
            pick = max if study.direction == StudyDirection.MAXIMIZE else min
            parent = pick(tournament, key=lambda t: t.value)
            child, mutation = mutate(self.space, ArchConfig.from_dict(parent.user_attrs[attrs.ARCH]), rng)
            lineage = {attrs.PARENT_TRIAL: parent.number, attrs.MUTATION: mutation,
                       attrs.GENERATION: parent.user_attrs[attrs.GENERATION] + 1}
        for key, value in lineage.items():
            # A sampler sees a FrozenTrial; Optuna's own samplers write through the storage too.
            study._storage.set_trial_user_attr(trial._trial_id, key, value)
        self._children[trial.number] = child

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return {}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        # Labels are the field, or the field plus the options left by a filter: `heads[4,8,16]`.
        # The child is a member of the space, so the walk asks exactly for values it allows.
        return getattr(self._children[trial.number], param_name.split("[", 1)[0])

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self._children.pop(trial.number, None)


# ---- the controller registry ------------------------------------------------------------------

@dataclass(frozen=True)
class Controller:
    """A sampler factory, and whether its sampler handles several objectives."""

    make: Callable[[SearchSpace, int | None, int | None], BaseSampler]  # (space, seed, start-up trials)
    multi_objective: bool
    # Whether a sampler made again with the same seed continues where the first left off: evolution
    # rebuilds its state from the trials. Optuna's samplers restart their random stream instead.
    resumes_exactly: bool = False
    # Whether it learns from trials stopped early on its own (TPE ranks them by their intermediate
    # values; random search learns nothing); the others see them through `SeesStoppedTrials`.
    reads_stopped: bool = False


def _tpe(space: SearchSpace, seed: int | None, startup: int | None) -> BaseSampler:
    # Multivariate TPE models the parameters jointly; `group` splits the trials by which labels
    # they drew (`final_norm` vs `final_norm[false]` under post-norm, `heads[...]` subsets), which
    # plain multivariate TPE cannot, dropping those to independent sampling. `group` is still
    # flagged experimental: silence the warning that would open every study.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, **_startup(startup))


def _cmaes(space: SearchSpace, seed: int | None, startup: int | None) -> BaseSampler:
    numeric = [p.field for p in space.params.values() if p.kind in ("int", "float")]
    categorical = [p.field for p in space.params.values() if p.kind in ("choice", "bool")]
    if categorical:
        # Optuna would log this for every parameter of every trial; once per study says it all.
        _logger.warning("cmaes: CMA-ES models only the numeric parameters (%s); the %d categorical ones "
                        "are drawn at random by its independent sampler", ", ".join(numeric) or "none",
                        len(categorical))
    return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False, **_startup(startup))


def _gp(space: SearchSpace, seed: int | None, startup: int | None) -> BaseSampler:
    # The GP models the parameters every trial drew; option-filtered labels (see _tpe) fall back to
    # random draws by design, so Optuna's warning for each of them in each trial is noise.
    return optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False, **_startup(startup))


def _startup(startup: int | None) -> dict[str, int]:
    """A model-based sampler's start-up trials: the study's first draw when it has one (warm starts
    and the covering design, `search.study.warm_start`), else the sampler's own default."""
    return {} if not startup else {"n_startup_trials": startup}


def _population(startup: int | None) -> int:
    """An evolutionary controller's first generation holds the whole first draw."""
    return max(POPULATION_SIZE, startup or 0)


CONTROLLERS: dict[str, Controller] = {
    "tpe": Controller(_tpe, multi_objective=True, reads_stopped=True),
    "random": Controller(lambda space, seed, startup: optuna.samplers.RandomSampler(seed=seed), multi_objective=True,
                         reads_stopped=True),
    "nsga2": Controller(lambda space, seed, startup: optuna.samplers.NSGAIISampler(population_size=_population(startup),
                                                                                   seed=seed), multi_objective=True),
    "cmaes": Controller(_cmaes, multi_objective=False),
    "gp": Controller(_gp, multi_objective=True),  # Optuna 5's GPSampler uses log EHVI for several
    "evolution": Controller(lambda space, seed, startup: RegularizedEvolutionSampler(
        space, population_size=_population(startup), seed=seed), multi_objective=False, resumes_exactly=True),
}
# The one the real-cram benchmark picks (benchmarks/RESULTS.md, "Controllers judged on real crams",
# the 301-row rerun): with warm starts and the covering design, Optuna's GP has the lowest median and
# worst-decile regret at 32 and 64 trials, on both tables measured.
DEFAULT_CONTROLLER = "gp"


def make_sampler(controller: str, objective: str, space: SearchSpace, seed: int | None,
                 startup: int | None = None, early_stop: bool = False) -> BaseSampler:
    """The sampler of `controller` for `objective`, modelling only after `startup` trials (the
    study's first draw; None: the sampler's default), and with `early_stop` also the trials
    stopped early (`search.study.stopped.SeesStoppedTrials`); a one-line CramnasError names what is allowed."""
    if controller not in CONTROLLERS:
        raise CramnasError(f"--controller: unknown {controller!r}; allowed: {', '.join(CONTROLLERS)}")
    if objective not in OBJECTIVES:
        raise CramnasError(f"--objective: unknown {objective!r}; allowed: {', '.join(OBJECTIVES)}")
    if OBJECTIVES[objective].multi and not CONTROLLERS[controller].multi_objective:
        allowed = [name for name, c in CONTROLLERS.items() if c.multi_objective]
        raise CramnasError(f"--objective {objective} has {len(OBJECTIVES[objective].directions)} objectives, "
                         f"which --controller {controller} cannot optimise; use --controller "
                         f"{' | '.join(allowed)} or a single --objective")
    sampler = CONTROLLERS[controller].make(space, seed, startup)
    if early_stop and not CONTROLLERS[controller].reads_stopped and not OBJECTIVES[objective].multi:
        sampler = SeesStoppedTrials(sampler)
    return sampler


# ---- studies ----------------------------------------------------------------------------------

def open_study(name: str, storage: str | BaseStorage | None, controller: str, objective: str,
               space: SearchSpace, seed: int | None = None, resume: bool = False,
               warm_starts: Sequence[tuple[str, ArchConfig]] = (), cover: bool = False,
               trials: int | None = None, early_stop: bool = False) -> optuna.Study:
    """Create study `name` in `storage`, or with `resume` reopen it with the same settings.

    A new study's first trials are queued here (`search.study.warm_start.first_draw`): the `warm_starts`
    (name, architecture), then with `cover` a covering design that trains every value of every
    choice and bool; the sampler models only after them (its start-up trials, evolution's and
    NSGA-II's first population), a number stored with the study so that a resume builds the same.
    A study of fewer `trials` than that queues only its first `trials` (none left waiting), and a
    resume to more trials does not add the rest: its sampler takes over after those. With
    `early_stop` the sampler models the trials that early stopping ends too (`make_sampler`)."""
    from search.study.warm_start import enqueue_first_draw, first_draw

    settings = {attrs.CONTROLLER: controller, attrs.OBJECTIVE: objective, attrs.SPACE: space.name, attrs.SEED: seed}
    where = storage if isinstance(storage, str) else "this storage"
    exists = storage is not None and name in optuna.study.get_all_study_names(storage)
    if not resume:
        if exists:
            raise CramnasError(f"study {name} exists in {where}; pass --resume or choose another --study")
        draw = first_draw(space, warm_starts, cover, seed)[:trials]
        study = optuna.create_study(study_name=name, storage=storage,
                                    sampler=make_sampler(controller, objective, space, seed, len(draw), early_stop),
                                    directions=list(OBJECTIVES[objective].directions))
        for key, value in {**settings, attrs.STARTUP: len(draw)}.items():
            study.set_user_attr(key, value)
        enqueue_first_draw(study, space, draw)
        return study
    if not exists:
        raise CramnasError(f"study {name} not found in {where}; drop --resume to start it")
    loaded = optuna.load_study(study_name=name, storage=storage)
    stored = loaded.user_attrs
    if controller in CONTROLLERS and not CONTROLLERS[controller].resumes_exactly:
        seed = resumed_seed(seed, len(loaded.get_trials(deepcopy=False)))
    sampler = make_sampler(controller, objective, space, seed, stored.get(attrs.STARTUP), early_stop)
    study = optuna.load_study(study_name=name, storage=storage, sampler=sampler)
    for key, value in settings.items():
        if stored.get(key) != value:
            raise CramnasError(f"study {name} was created with --{key} {stored.get(key)}, not {value}; "
                             f"resume it with --{key} {stored.get(key)} or choose another --study")
    return study


def resumed_seed(seed: int | None, trials: int) -> int | None:
    """The sampler seed of a study resumed with `trials` trials: its own seed moved on by them. The
    same seed again restarts an Optuna sampler's random stream, so random search (and any sampler's
    random draws) would propose the first session's architectures again, each told as a repeat: a
    32-trial random study resumed after 18 trials repeated trials 11-17 as trials 18-24."""
    return None if seed is None or trials == 0 else (seed * 1_000_003 + trials) % 2**31


@dataclass(frozen=True)
class Proposal:
    """One asked trial. `repeat_of` is a COMPLETE trial with the same architecture: tell its values
    instead of training. `rerun_of` is the trial the driver's death cut short that this one trains
    again (`rerun_cut_short`). The other lineage fields are set by evolution only."""

    number: int
    config: ArchConfig
    fingerprint: str  # config.fingerprint(), computed once here
    parent_trial: int | None = None
    mutation: str | None = None
    generation: int | None = None
    repeat_of: int | None = None
    rerun_of: int | None = None
    warm_start: str | None = None  # the first draw's: where a warm start came from (search.study.warm_start)
    first_draw: str | None = None  # `cover` for a trial of the covering design
    promoted_from: int | None = None  # a screened study's trial: the screen's trial it crams whole (search.study.screen)


def ask(study: optuna.Study, space: SearchSpace) -> Proposal:
    """Ask the study's sampler for a member of `space`; infeasible draws are told PRUNED (user
    attribute `infeasible`) and redrawn. The trial stores `arch` and `fingerprint`. A re-run queued
    by `rerun_cut_short` comes first, with its original's parameters (Optuna's waiting trials)."""
    config, draw = space.sample(OptunaDraws(study))
    trial = draw.trial
    fingerprint = config.fingerprint()
    # `arch` last: it marks a recorded draw (rerun_cut_short, _drawn_original), so a driver killed
    # between the two writes leaves a trial that reads as cut inside `ask`, never an `arch` without
    # its fingerprint (seen under load in tests/reliability/test_driver_crash.py).
    trial.set_user_attr(attrs.FINGERPRINT, fingerprint)
    trial.set_user_attr(attrs.ARCH, config.to_dict())
    rerun_of = trial.user_attrs.get(attrs.RERUN_OF)
    if rerun_of is not None:
        # The sampler's before_trial ran for it too (evolution bred a child it never hands out,
        # since the parameters are fixed): the architecture is the original's, so is its lineage.
        cut, drawn = _drawn_original(study.get_trials(deepcopy=False), rerun_of).user_attrs, trial.user_attrs
        for key in attrs.LINEAGE:
            if key in cut or key in drawn:
                trial.set_user_attr(key, cut.get(key))
    original = next((t.number for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                     if t.user_attrs.get(attrs.FINGERPRINT) == fingerprint and attrs.REPEAT_OF not in t.user_attrs),
                    None)
    if original is not None:
        trial.set_user_attr(attrs.REPEAT_OF, original)
    # Re-read: samplers (evolution) write their attributes through the storage in before_trial.
    stored = _trial(study, trial.number).user_attrs
    return Proposal(trial.number, config, fingerprint, stored.get(attrs.PARENT_TRIAL), stored.get(attrs.MUTATION),
                    stored.get(attrs.GENERATION), original, rerun_of, stored.get(attrs.WARM_START),
                    stored.get(attrs.FIRST_DRAW), stored.get(attrs.PROMOTED_FROM))


def tell(study: optuna.Study, trial_number: int, values: Sequence[float] | None = None,
         state: str = COMPLETE, reason: str | None = None,
         intermediate: Sequence[tuple[int, float]] | None = None,
         metrics: dict[str, float] | None = None) -> FrozenTrial:
    """Finish a trial in `state` (`search.base.states`: complete, repeat, pruned or failed): `values` for
    complete ones and repeats, `reason` (user attribute `failure_reason`) for the others,
    `intermediate` the (step, train MLM loss) curve, `metrics` every number the trial reported
    (user attribute `metrics`). Telling a finished trial is a no-op, so a driver may safely retry
    after a crash."""
    if state not in FINISHED_STATES:
        raise ValueError(f"state: unknown {state!r}; allowed: {', '.join(FINISHED_STATES)}")
    trial = _trial(study, trial_number)
    if trial.state.is_finished():
        return trial
    if reason is not None:
        study._storage.set_trial_user_attr(trial._trial_id, attrs.FAILURE_REASON, reason)
    if metrics:  # what export, the terminal view and a repeat of this architecture read back
        study._storage.set_trial_user_attr(trial._trial_id, attrs.METRICS, dict(metrics))
    if intermediate:
        curve = [[int(step), float(value)] for step, value in intermediate]  # as JSON stores it
        study._storage.set_trial_user_attr(trial._trial_id, attrs.INTERMEDIATE, curve)
        # Optuna gives a pruned trial its last intermediate value as its value, and TPE ranks
        # pruned trials by it: only an objective whose value is an MLM loss may go there. (Direct to
        # storage, since a new optuna.Trial handle would rerun the sampler's before_trial.)
        objective = OBJECTIVES.get(study.user_attrs.get(attrs.OBJECTIVE))
        if objective is not None and objective.mlm_loss:
            for step, value in curve:
                study._storage.set_trial_intermediate_value(trial._trial_id, step, value)
    told = None if values is None else list(values)
    return study.tell(trial_number, told, state=STATES[state].trial_state, skip_if_finished=True)


def study_counts(study: optuna.Study) -> dict[str, int]:
    """Trials by state; repeats count as complete: each is one of the study's trials, with a result.
    Two kinds count apart, as no result of the study's: infeasible draws (PRUNED with user attribute
    `infeasible`), and `cut_short`, failed trials the driver's death cut short (`is_cut_short`),
    whose architectures are trained again in re-runs (`rerun_cut_short`), which count."""
    counts = dict.fromkeys((*(name for name in STATES if name != REPEAT), "infeasible", "cut_short"), 0)
    for trial in study.get_trials(deepcopy=False, states=tuple({row.trial_state for row in STATES.values()})):
        state = state_of_trial(trial)
        infeasible = trial.state == TrialState.PRUNED and attrs.INFEASIBLE in trial.user_attrs
        counts["infeasible" if infeasible else "cut_short" if is_cut_short(trial)
               else COMPLETE if state == REPEAT else state] += 1
    return counts


# The failure reason of a trial whose driver died under it: not the trial's fault.
DRIVER_DIED = "driver died"


def is_cut_short(trial: FrozenTrial) -> bool:
    """A trial failed because the driver died while it ran (`fail_stale_running`)."""
    return trial.state == TrialState.FAIL and trial.user_attrs.get(attrs.FAILURE_REASON) == DRIVER_DIED


def fail_stale_running(study: optuna.Study) -> list[int]:
    """Fail the RUNNING trials a dead driver left (one driver per study: on resume, every running
    trial is stale). Returns their numbers."""
    stale = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
    for number in stale:
        tell(study, number, state=FAILED, reason=DRIVER_DIED)
    return stale


def rerun_cut_short(study: optuna.Study, limit: int) -> list[int]:
    """Queue a re-run of each trial the driver's death cut short that has none yet, oldest first and
    at most `limit` (the trials the study has left to run): a new trial with the same parameters,
    hence the same architecture, and the user attribute `rerun_of`, which `ask` hands out before
    drawing anything new (Optuna's waiting trials, as `RetryFailedTrialCallback` re-runs a failed
    trial). Returns the numbers of the trials re-run.

    Each is re-run once, whatever the number of resumes: a queued re-run is a trial already, and
    one cut short in its turn is re-run as itself. A trial whose architecture was never drawn (the
    driver died inside `ask`) had nothing in flight and is not re-run; nor is one that failed by
    its own fault (its reason is not `DRIVER_DIED`). A queued re-run cut short inside `ask` is
    re-run although it drew nothing: its architecture was fixed when it was queued."""
    trials = study.get_trials(deepcopy=False)
    rerun = {t.user_attrs[attrs.RERUN_OF] for t in trials if t.user_attrs.get(attrs.RERUN_OF) is not None}
    owed = [t for t in trials if is_cut_short(t) and t.number not in rerun
            and (attrs.ARCH in t.user_attrs or t.user_attrs.get(attrs.RERUN_OF) is not None)]
    for trial in owed[:max(limit, 0)]:
        params = _drawn_original(trials, trial.number).params  # all of them: a re-run cut in `ask` has only some
        study.enqueue_trial(dict(params), user_attrs={attrs.RERUN_OF: trial.number})
    return [trial.number for trial in owed[:max(limit, 0)]]


def _drawn_original(trials: list[FrozenTrial], number: int) -> FrozenTrial:
    """Trial `number`, or where it is a re-run cut short before its draw was recorded, the trial of
    its chain of re-runs that drew the architecture (its parameters and lineage are whole)."""
    trial = trials[number]
    while attrs.ARCH not in trial.user_attrs and trial.user_attrs.get(attrs.RERUN_OF) is not None:
        trial = trials[trial.user_attrs[attrs.RERUN_OF]]
    return trial


def _trial(study: optuna.Study, number: int) -> FrozenTrial:
    trials = study.get_trials(deepcopy=False)
    if not 0 <= number < len(trials):
        raise ValueError(f"trial {number}: study {study.study_name} has trials 0..{len(trials) - 1}")
    return trials[number]
