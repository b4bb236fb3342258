"""Controllers on the real CPU space with a synthetic score: no training; ~10 s on 2 quiet cores (GP is half)."""

from __future__ import annotations

import logging

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from search.base.objectives import OBJECTIVES
from search.study.controllers import (
    CONTROLLERS,
    RegularizedEvolutionSampler,
    ask,
    fail_stale_running,
    make_sampler,
    open_study,
    rerun_cut_short,
    study_counts,
    tell,
)
from space import ArchConfig, default_space_path, load_space

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def space():
    return load_space(default_space_path("cpu"))


def score(arch: ArchConfig) -> float:
    """Cheap and smooth: deeper, wider and gated is better."""
    return arch.layers + arch.hidden / 64 + 3.0 * arch.gated


def run(study, space, trials, scores=lambda proposal: score(proposal.config)):
    """Ask and tell `trials` times, telling repeats their recorded values as a driver does."""
    proposals = []
    for _ in range(trials):
        proposal = ask(study, space)
        if proposal.repeat_of is not None:
            tell(study, proposal.number, study.trials[proposal.repeat_of].values)
        else:
            value = scores(proposal)
            tell(study, proposal.number, value if isinstance(value, list) else [value])
        proposals.append(proposal)
    return proposals


def evolution_study(space, population_size=6, sample_size=3, seed=0, direction="maximize"):
    sampler = RegularizedEvolutionSampler(space, population_size, sample_size, seed=seed)
    return optuna.create_study(sampler=sampler, direction=direction)


@pytest.mark.parametrize("controller", [pytest.param(name, marks=pytest.mark.slow) if name == "gp" else name
                                        for name in CONTROLLERS])  # gp: about a second per ask
def test_every_controller_runs_a_single_objective_study(space, controller):
    study = open_study("s", None, controller, "probe", space, seed=0)
    proposals = run(study, space, 12)
    assert all(space.contains(p.config) for p in proposals)
    assert study_counts(study)["complete"] == 12
    assert all(ArchConfig.from_dict(t.user_attrs["arch"]).fingerprint() == t.user_attrs["fingerprint"]
               for t in study.get_trials(states=(TrialState.COMPLETE,)))
    assert all(p.fingerprint == p.config.fingerprint() for p in proposals)


@pytest.mark.parametrize("controller", ["nsga2", "random", "tpe"])  # gp too, but at a second per ask
def test_multi_objective_controllers(space, controller):
    study = open_study("s", None, controller, "probe+throughput", space, seed=0)
    proposals = run(study, space, 12, lambda p: [score(p.config), 1e6 / p.config.num_params()])
    assert all(space.contains(p.config) for p in proposals)
    assert len(study.best_trials) >= 1


def test_gp_accepts_several_objectives(space):
    assert isinstance(make_sampler("gp", "probe+throughput", space, 0), optuna.samplers.GPSampler)


@pytest.mark.parametrize("controller", ["evolution", "cmaes"])
def test_multi_objective_needs_a_capable_controller(space, controller):
    with pytest.raises(ValueError, match=rf"--objective probe\+throughput .* --controller {controller}.*nsga2"):
        open_study("s", None, controller, "probe+throughput", space)


def test_unknown_names_list_what_is_allowed(space):
    with pytest.raises(ValueError, match="--controller: unknown 'bayes'; allowed: tpe, random"):
        make_sampler("bayes", "probe", space, 0)
    with pytest.raises(ValueError, match="--objective: unknown 'glue'; allowed: probe, mlm"):
        make_sampler("tpe", "glue", space, 0)


def test_objective_values_pick_the_metrics_in_order():
    metrics = {"probe_average": 0.7, "tokens_per_s": 5000, "validation_loss": 3.2}
    assert OBJECTIVES["probe+throughput"].values(metrics) == [0.7, 5000.0]
    assert OBJECTIVES["mlm"].values(metrics) == [3.2]
    with pytest.raises(ValueError, match="reported no probe_average"):
        OBJECTIVES["probe"].values({"validation_loss": 3.2})


def test_cmaes_warns_once_about_categorical_parameters(space, caplog):
    optuna.logging.enable_propagation()  # let caplog see Optuna's own per-trial warnings too
    try:
        with caplog.at_level(logging.WARNING):
            run(open_study("s", None, "cmaes", "probe", space, seed=0), space, 12)
    finally:
        optuna.logging.disable_propagation()
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "categorical" in warned[0], warned


# ---- regularized evolution --------------------------------------------------------------------

def test_evolution_starts_random_then_mutates_the_tournament_winner(space):
    study = evolution_study(space, population_size=6)
    proposals = run(study, space, 30)
    for p in proposals[:6]:
        assert (p.generation, p.parent_trial, p.mutation) == (0, None, None)
    by_number = {p.number: p for p in proposals}
    for p in proposals[6:]:
        parent = by_number[p.parent_trial]
        assert p.generation == parent.generation + 1
        field = p.mutation.split(":")[0]  # "hidden: 256 -> 192 (heads: 8 -> 4)"
        assert getattr(p.config, field) != getattr(parent.config, field)
        attrs = study.trials[p.number].user_attrs
        assert (attrs["parent_trial"], attrs["mutation"], attrs["generation"]) == (
            p.parent_trial, p.mutation, p.generation)


def test_evolution_ages_out_old_trials(space):
    # Trials 0-4 score far above all later ones and stay the best of the study, yet once five
    # newer trials have completed they have left the population of five and breed no more.
    study = evolution_study(space, population_size=5, sample_size=5)
    run(study, space, 25, lambda p: 1000.0 + p.number if p.number < 5 else score(p.config))
    parents = {t.number: t.user_attrs.get("parent_trial") for t in study.trials}
    assert parents[5] in range(5)  # its population is trials 0-4
    for number, parent in parents.items():
        if parent is not None:
            assert number - 5 <= parent < number, (number, parent)  # among the 5 latest completed
    assert all(parents[n] >= 5 for n in range(10, 25))


def rank_of_parents(space, sample_size, direction="maximize"):
    """Mean share of its population that beat each parent (0: the best, about 0.5: a random one)."""
    population_size = 8
    study = evolution_study(space, population_size, sample_size, seed=3, direction=direction)
    run(study, space, 80, lambda p: p.config.num_params())  # distinct sizes: few ties
    better = (lambda a, b: a > b) if direction == "maximize" else (lambda a, b: a < b)
    trials = study.trials
    shares = []
    for trial in trials[population_size:]:
        window = trials[trial.number - population_size:trial.number]  # sequential: the latest 8
        parent = trials[trial.user_attrs["parent_trial"]]
        shares.append(sum(better(t.value, parent.value) for t in window) / (population_size - 1))
    return sum(shares) / len(shares)


def test_evolution_tournament_prefers_the_best(space):
    # Best of 4 drawn from 8 is mostly in the top quarter; a tournament of 1 is a uniform pick.
    assert rank_of_parents(space, 4) < 0.25
    assert rank_of_parents(space, 1) > 0.35
    assert rank_of_parents(space, 4, direction="minimize") < 0.25


def test_evolution_rejects_bad_sizes(space):
    with pytest.raises(ValueError, match="sample_size"):
        RegularizedEvolutionSampler(space, population_size=4, sample_size=5)


# ---- the study store ----------------------------------------------------------------------------

def test_dedupe_marks_repeats_of_completed_trials(space):
    study = open_study("s", None, "random", "probe", space, seed=0)
    first = run(study, space, 1)[0]
    study.enqueue_trial(study.trials[0].params)  # the same labels and values: the same architecture
    again = ask(study, space)
    assert again.repeat_of == first.number and again.config == first.config
    assert study.trials[again.number].user_attrs["repeat_of"] == first.number
    tell(study, again.number, study.trials[first.number].values)
    study.enqueue_trial(study.trials[0].params)
    assert ask(study, space).repeat_of == first.number  # the original, not the repeat


def test_a_window_that_changes_no_layer_is_a_repeat(space):
    study = open_study("s", None, "random", "probe", space, seed=0)
    drawn = run(study, space, 1)[0]
    one_layer = {k: v for k, v in study.trials[drawn.number].params.items() if k != "global_every"}
    one_layer.update(layers=1, local_window=0)
    study.enqueue_trial(one_layer)
    first = run(study, space, 1)[0]
    assert first.config.layers == 1 and first.repeat_of is None
    study.enqueue_trial({**one_layer, "local_window": 16, "global_every": 3})  # its one layer is global
    again = ask(study, space)
    assert again.config.local_window == 16 and again.repeat_of == first.number


@pytest.mark.slow
def test_resume_continues_exactly(space, tmp_path):
    # Evolution in SQLite, interrupted after 10 trials (one left running), against one
    # uninterrupted run: same proposals, same counts. The population of 20 is complete after
    # trial 20, so trials 21-24 are bred from what the resumed study read back from the file.
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = open_study("evo", url, "evolution", "probe", space, seed=7)
    before = run(study, space, 10)
    dangling = ask(study, space)
    counts = study_counts(study)
    del study

    resumed = open_study("evo", url, "evolution", "probe", space, seed=7, resume=True)
    assert isinstance(resumed.sampler, RegularizedEvolutionSampler)
    assert study_counts(resumed) == counts
    assert fail_stale_running(resumed) == [dangling.number]
    after = run(resumed, space, 14)

    straight = open_study("evo", None, "evolution", "probe", space, seed=7)
    reference = run(straight, space, 10)
    tell(straight, ask(straight, space).number, state="failed", reason="driver died")
    reference += run(straight, space, 14)
    assert [p.config for p in before + after] == [p.config for p in reference]
    assert study_counts(resumed) == study_counts(straight) == {
        "complete": 24, "pruned": 0, "failed": 0, "running": 0, "infeasible": 0, "cut_short": 1}
    assert all(p.parent_trial is not None for p in after[-4:])


@pytest.mark.parametrize("controller", ["random", "tpe"])
def test_a_resumed_study_draws_new_architectures(space, tmp_path, controller):
    # A resumed Optuna sampler with the study's own seed would restart its random stream and
    # propose the first session's architectures again (each a repeat that trains nothing).
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    first = run(open_study("s", url, controller, "probe", space, seed=0), space, 6)
    again = run(open_study("s", url, controller, "probe", space, seed=0, resume=True), space, 6)
    assert [p.repeat_of for p in again] == [None] * 6
    assert {p.fingerprint for p in again}.isdisjoint(p.fingerprint for p in first)


@pytest.mark.parametrize("kind", ["sqlite", "journal"])
def test_open_study_refuses_mismatches(space, tmp_path, kind):
    def storage():  # a fresh handle each time, as a new driver process would open it
        if kind == "sqlite":
            return f"sqlite:///{tmp_path / 'optuna.db'}"
        return JournalStorage(JournalFileBackend(str(tmp_path / "journal.log")))

    with pytest.raises(ValueError, match="study s not found .*; drop --resume"):
        open_study("s", storage(), "tpe", "probe", space, seed=0, resume=True)
    open_study("s", storage(), "tpe", "probe", space, seed=0)
    with pytest.raises(ValueError, match="study s exists .*; pass --resume or choose another --study"):
        open_study("s", storage(), "tpe", "probe", space, seed=0)
    with pytest.raises(ValueError, match="created with --controller tpe, not random; resume it with "
                                         "--controller tpe or choose another --study"):
        open_study("s", storage(), "random", "probe", space, seed=0, resume=True)
    with pytest.raises(ValueError, match="created with --objective probe, not mlm"):
        open_study("s", storage(), "tpe", "mlm", space, seed=0, resume=True)
    with pytest.raises(ValueError, match="created with --seed 0, not 1"):
        open_study("s", storage(), "tpe", "probe", space, seed=1, resume=True)
    assert open_study("s", storage(), "tpe", "probe", space, seed=0, resume=True).user_attrs["controller"] == "tpe"


def test_tell_is_idempotent_and_records_why(space):
    study = open_study("s", None, "random", "probe", space, seed=0)
    done = ask(study, space)
    tell(study, done.number, [1.0], metrics={"probe_average": 1.0, "tokens_per_s": 900.0})
    tell(study, done.number, [2.0])  # a driver retrying after a crash
    tell(study, done.number, state="failed", reason="late")
    assert study.trials[done.number].values == [1.0]
    assert "failure_reason" not in study.trials[done.number].user_attrs
    assert study.trials[done.number].user_attrs["metrics"] == {"probe_average": 1.0, "tokens_per_s": 900.0}
    broken = ask(study, space)
    tell(study, broken.number, state="failed", reason="out of memory")
    assert study.trials[broken.number].state == TrialState.FAIL
    assert study.trials[broken.number].user_attrs["failure_reason"] == "out of memory"
    with pytest.raises(ValueError, match="state: unknown 'done'"):
        tell(study, ask(study, space).number, [1.0], state="done")
    repeat = ask(study, space)
    tell(study, repeat.number, [1.0], state="repeat")  # a repeat is COMPLETE in the study
    assert study.trials[repeat.number].state == TrialState.COMPLETE


@pytest.mark.parametrize("objective, pruned_value", [("mlm", 4.5), ("probe", None)])
def test_learning_curves_become_optuna_values_only_for_the_mlm_objective(space, objective, pruned_value):
    # Optuna gives a pruned trial its last intermediate value as its value: an MLM loss must not
    # pose as a probe score.
    study = open_study("s", None, "tpe", objective, space, seed=0)
    pruned = ask(study, space)
    tell(study, pruned.number, state="pruned", reason="asha", intermediate=[(1, 6.0), (2, 4.5)])
    trial = study.trials[pruned.number]
    assert trial.value == pruned_value
    assert trial.user_attrs["intermediate"] == [[1, 6.0], [2, 4.5]]
    assert trial.user_attrs["failure_reason"] == "asha"


def test_study_counts_and_stale_trials(space):
    study = open_study("s", None, "random", "probe", space, seed=0)
    run(study, space, 2)
    tell(study, ask(study, space).number, state="pruned", reason="asha")
    tell(study, ask(study, space).number, state="failed", reason="nan loss")
    infeasible = study.ask()
    infeasible.set_user_attr("infeasible", "params_millions <= 8")
    study.tell(infeasible, state=TrialState.PRUNED)
    stale = [ask(study, space).number, ask(study, space).number]
    assert study_counts(study) == {"complete": 2, "pruned": 1, "failed": 1, "running": 2, "infeasible": 1,
                                   "cut_short": 0}
    assert fail_stale_running(study) == stale
    assert study.trials[stale[0]].user_attrs["failure_reason"] == "driver died"
    # Cut short by the driver's death: no result of the study's, so they count apart (their re-runs count).
    assert study_counts(study) == {"complete": 2, "pruned": 1, "failed": 1, "running": 0, "infeasible": 1,
                                   "cut_short": 2}


@pytest.mark.parametrize("controller", ["tpe", "evolution"])
def test_trials_cut_short_are_re_run_once_with_their_architectures(controller, space, tmp_path):
    """A dead driver's running trials: each comes back first as a new trial with the same
    architecture (and evolution's lineage), linked by `rerun_of`; a trial failed by its own fault,
    one whose architecture was never drawn, and one already re-run are not re-run; at most `limit`."""
    from search.study.controllers import POPULATION_SIZE

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = open_study("s", url, controller, "mlm", space, seed=3)
    run(study, space, POPULATION_SIZE + 2 if controller == "evolution" else 3)  # evolution: breeding
    tell(study, ask(study, space).number, state="failed", reason="nan loss")
    in_flight = [ask(study, space) for _ in range(3)]
    undrawn = study.ask().number  # the driver died inside `ask`, before the architecture was recorded
    del study

    resumed = open_study("s", url, controller, "mlm", space, seed=3, resume=True)
    assert fail_stale_running(resumed) == [*(p.number for p in in_flight), undrawn]
    assert rerun_cut_short(resumed, limit=2) == [p.number for p in in_flight[:2]]
    reruns = [ask(resumed, space) for _ in range(2)]
    fresh = ask(resumed, space)  # the queue is empty: a new draw
    for original, rerun in zip(in_flight, reruns):
        assert (rerun.rerun_of, rerun.config, rerun.fingerprint) == (original.number, original.config, original.fingerprint)
        assert resumed.trials[rerun.number].params == resumed.trials[original.number].params
        assert (rerun.generation, rerun.parent_trial, rerun.mutation) == \
            (original.generation, original.parent_trial, original.mutation)
    if controller == "evolution":
        assert all(p.parent_trial is not None for p in in_flight)  # the lineage checked above is a real one
    assert fresh.rerun_of is None
    for proposal in (*reruns, fresh):
        tell(resumed, proposal.number, [score(proposal.config)])

    # Another resume: the two re-runs are done, only the third trial cut short is still owed.
    again = open_study("s", url, controller, "mlm", space, seed=3, resume=True)
    assert fail_stale_running(again) == []
    assert rerun_cut_short(again, limit=5) == [in_flight[2].number]
    assert rerun_cut_short(again, limit=5) == []  # queued already: a trial of the study
    assert ask(again, space).config == in_flight[2].config


def test_a_re_run_cut_short_inside_ask_is_re_run_with_its_originals_whole_architecture(space, tmp_path):
    """The driver can die after a queued re-run is handed out and before its draw is recorded: the
    re-run has no architecture and only some parameters, and its original counts as re-run already.
    It is re-run itself, with the original's parameters, or the architecture would never be trained."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = open_study("s", url, "tpe", "mlm", space, seed=3)
    run(study, space, 3)
    in_flight = ask(study, space)
    del study

    resumed = open_study("s", url, "tpe", "mlm", space, seed=3, resume=True)
    assert fail_stale_running(resumed) == [in_flight.number]
    assert rerun_cut_short(resumed, limit=5) == [in_flight.number]
    cut_in_ask = resumed.ask()  # the queued re-run, handed out; the driver dies before the draw
    assert cut_in_ask.user_attrs["rerun_of"] == in_flight.number and cut_in_ask.params == {}
    del resumed

    again = open_study("s", url, "tpe", "mlm", space, seed=3, resume=True)
    assert fail_stale_running(again) == [cut_in_ask.number]
    assert rerun_cut_short(again, limit=5) == [cut_in_ask.number]
    rerun = ask(again, space)
    assert (rerun.rerun_of, rerun.config, rerun.fingerprint) == (cut_in_ask.number, in_flight.config, in_flight.fingerprint)
    assert again.trials[rerun.number].params == again.trials[in_flight.number].params
    assert rerun_cut_short(again, limit=5) == []  # each once


@pytest.mark.parametrize("dies_at", ["fingerprint", "arch"])
def test_a_driver_killed_between_the_draws_writes_leaves_a_whole_draw_or_none(dies_at, space, tmp_path, monkeypatch):
    """`ask` records a draw in two writes; the driver can die between them (seen under load in
    tests/reliability/test_driver_crash.py). A trial holding `arch`, the mark of a recorded draw that
    re-runs and readers rely on, holds its fingerprint too; one without it is re-run as drawn-nothing."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = open_study("s", url, "tpe", "mlm", space, seed=3)
    run(study, space, 3)
    write = optuna.trial.Trial.set_user_attr

    def dying(self, key, value):
        if key == dies_at:
            raise KeyboardInterrupt  # the driver killed before this write
        write(self, key, value)
    monkeypatch.setattr(optuna.trial.Trial, "set_user_attr", dying)
    with pytest.raises(KeyboardInterrupt):
        ask(study, space)
    monkeypatch.undo()

    resumed = open_study("s", url, "tpe", "mlm", space, seed=3, resume=True)
    cut = fail_stale_running(resumed)
    left = resumed.trials[cut[0]].user_attrs
    assert "arch" not in left or "fingerprint" in left
    assert rerun_cut_short(resumed, limit=5) == ([cut[0]] if "arch" in left else [])
