"""A study with early stopping on gives its controller every trial (search.study.stopped), and the rung
measurement ranks what it should: a stand-in objective, no training."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from search.base import attrs
from search.base.states import COMPLETE, PRUNED
from search.study.controllers import ask, make_sampler, open_study, tell
from search.study.stopped import SeesStoppedTrials, imputed_finals, rung_ranking, study_rung_ranking
from space import ArchConfig, default_space_path, load_space

optuna.logging.set_verbosity(optuna.logging.WARNING)
REPORTS, RUNG = 8, 3


def curve(arch: ArchConfig) -> list[tuple[int, float]]:
    """A stand-in learning curve: every architecture starts at 7 and falls towards its own floor,
    deeper, wider and gated ones lower, so the loss at any report ranks the end."""
    floor = 6.0 - 0.4 * arch.layers - arch.hidden / 128 - 0.5 * arch.gated
    return [(step, floor + (7.0 - floor) * 0.7 ** step) for step in range(1, REPORTS + 1)]


def crammed_study(early_stop: bool, trials: int = 24):
    """`trials` trials on the CPU space; from the 4th on, one whose loss at report RUNG is outside
    the best third there of the trials before it is stopped, as ASHA would with reduction 3."""
    space = load_space(default_space_path("cpu"))
    study = open_study("stand-in", None, "gp", "mlm", space, seed=0, early_stop=early_stop)
    at_rung = []
    for _ in range(trials):
        proposal = ask(study, space)
        if proposal.repeat_of is not None:
            tell(study, proposal.number, study.trials[proposal.repeat_of].values)
            continue
        losses = curve(proposal.config)
        loss = losses[RUNG - 1][1]
        stop = len(at_rung) >= 3 and loss > sorted(at_rung)[len(at_rung) // 3]
        at_rung.append(loss)
        if stop:
            tell(study, proposal.number, state=PRUNED, reason="stopped early by ASHA", intermediate=losses[:RUNG])
        else:
            tell(study, proposal.number, [losses[-1][1]], state=COMPLETE, intermediate=losses)
    return study


def modelled(early_stop: bool) -> tuple[optuna.Study, list[int]]:
    """The study, and how many trials the GP fitted its model on at each draw it modelled."""
    seen: list[int] = []
    fit = optuna.samplers.GPSampler._sample_relative_impl

    def counting(self, study, completed_trials, running_trials, search_space):
        seen.append(len(completed_trials))
        return fit(self, study, completed_trials, running_trials, search_space)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(optuna.samplers.GPSampler, "_sample_relative_impl", counting)
        return crammed_study(early_stop), seen


@pytest.fixture(scope="module")
def with_early_stopping():
    return modelled(early_stop=True)


@pytest.mark.slow  # the GP: about half a second a draw
def test_with_early_stopping_the_controller_models_every_trial_it_stopped(with_early_stopping):
    study, seen = with_early_stopping
    states = [t.state for t in study.trials]
    stopped = [t for t in study.trials if t.state == TrialState.PRUNED]
    assert len(stopped) >= 3, states  # the stand-in ASHA did stop trials
    finished_before_last = sum(1 for t in study.trials[:-1] if t.state in (TrialState.COMPLETE, TrialState.PRUNED))
    # The last draw was modelled on every trial before it: the complete ones and the stopped ones.
    assert seen[-1] == finished_before_last
    assert seen[-1] > sum(1 for t in study.trials[:-1] if t.state == TrialState.COMPLETE)


@pytest.mark.slow
def test_without_the_wrapper_a_stopped_trial_is_lost_to_the_gp():
    """The failure `SeesStoppedTrials` exists for: Optuna's GP fits complete trials only."""
    study, seen = modelled(early_stop=False)
    assert seen[-1] == sum(1 for t in study.trials[:-1] if t.state == TrialState.COMPLETE)
    assert any(t.state == TrialState.PRUNED for t in study.trials)


def test_a_stopped_trial_is_told_the_final_its_peers_predict():
    def trial(state, curve, value=None):
        return create_trial(state=state, value=value, params={}, distributions={},
                            user_attrs={attrs.INTERMEDIATE: [[step, loss] for step, loss in curve.items()]})

    # Finals are exactly 2 * loss at report 3 - 4 among the complete trials.
    trials = [trial(TrialState.COMPLETE, {3: loss, 6: loss - 0.5}, 2 * loss - 4) for loss in (6.0, 6.2, 6.5)]
    trials += [trial(TrialState.PRUNED, {1: 6.9, 3: 6.4}), trial(TrialState.PRUNED, {1: 6.9, 2: 6.8}),
               trial(TrialState.PRUNED, {})]  # stopped where no complete trial reported; an infeasible draw
    for number, t in enumerate(trials):
        t.number = number
    assert imputed_finals(trials) == {3: pytest.approx(8.8)}


def test_a_stopped_trial_shown_late_takes_out_the_parameters_it_lacks():
    """A trial stopped before a later one completed is shown to the GP only once its final can be
    imputed; the GP's cached intersection of parameters had passed it by and still held one the
    trial never drew (here `y`, as `final_norm` under post-norm), which the GP then failed to read
    (KeyError in `search.run --early-stop`). The wrapper's search space leaves such a parameter out."""
    x, y, kind = (optuna.distributions.FloatDistribution(0, 1), optuna.distributions.FloatDistribution(0, 1),
                  optuna.distributions.CategoricalDistribution(["a", "b"]))

    def trial(state, params, curve, value=None):
        return create_trial(state=state, value=value, params=params,
                            distributions={name: {"x": x, "y": y, "kind": kind}[name] for name in params},
                            user_attrs={attrs.INTERMEDIATE: [[step, loss] for step, loss in curve.items()]})

    study = optuna.create_study(sampler=SeesStoppedTrials(optuna.samplers.GPSampler(seed=0, n_startup_trials=2)))
    study.add_trial(trial(TrialState.COMPLETE, {"x": 0.1, "kind": "a", "y": 0.3}, {1: 6.0, 2: 5.0}, 5.0))
    study.add_trial(trial(TrialState.PRUNED, {"x": 0.9, "kind": "b"}, {1: 6.5}))  # stopped; no `y`
    study.add_trial(trial(TrialState.COMPLETE, {"x": 0.4, "kind": "a", "y": 0.7}, {1: 6.2, 2: 5.3}, 5.3))
    drawn = study.ask()  # two complete trials: the stopped one cannot be imputed yet, and is not shown
    drawn.suggest_float("x", 0, 1), drawn.suggest_categorical("kind", ["a", "b"]), drawn.suggest_float("y", 0, 1)
    study.tell(drawn, 5.1)
    study.add_trial(trial(TrialState.COMPLETE, {"x": 0.6, "kind": "a", "y": 0.5}, {1: 6.1, 2: 5.2}, 5.2))
    assert 1 in imputed_finals(study.trials)  # now it can: the GP is shown it as complete
    asked = study.ask()
    assert "y" not in study.sampler.infer_relative_search_space(study, asked._cached_frozen_trial)


def test_the_wrapper_is_only_for_controllers_that_drop_stopped_trials():
    space = load_space(default_space_path("cpu"))
    assert isinstance(make_sampler("gp", "mlm", space, 0, early_stop=True), SeesStoppedTrials)
    assert isinstance(make_sampler("evolution", "mlm", space, 0, early_stop=True), SeesStoppedTrials)
    assert isinstance(make_sampler("tpe", "mlm", space, 0, early_stop=True), optuna.samplers.TPESampler)
    assert isinstance(make_sampler("gp", "mlm", space, 0), optuna.samplers.GPSampler)


def test_rung_ranking_reads_order_and_its_interval():
    finals = [4.0, 4.5, 5.0, 5.5, 6.0, 6.5]
    same = [{1: 7.0, 2: final + 1.0} for final in finals]  # report 1 says nothing, report 2 everything
    reversed_ = [{2: 10.0 - final} for final in finals]
    ranks = {rank.report: rank for rank in rung_ranking(same, finals)}
    assert 1 not in ranks  # one value for every trial: no ranking to measure
    assert ranks[2].spearman == pytest.approx(1.0) and ranks[2].trials == 6
    assert ranks[2].low <= ranks[2].spearman <= ranks[2].high
    assert rung_ranking(reversed_, finals)[0].spearman == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="differ in length"):
        rung_ranking(same, finals[:-1])


@pytest.mark.slow
def test_a_study_measures_its_own_rungs(with_early_stopping):
    study, _ = with_early_stopping
    ranks = {rank.report: rank for rank in study_rung_ranking(study)}
    # Only complete trials reach report 8; on this stand-in every report ranks the end exactly.
    assert ranks[REPORTS].trials == sum(1 for t in study.trials if t.state == TrialState.COMPLETE
                                        and attrs.REPEAT_OF not in t.user_attrs)
    assert all(rank.spearman == pytest.approx(1.0) for rank in ranks.values())


@pytest.mark.parametrize(("flags", "on"), [((), False), (("--early-stop",), True), (("--no-early-stop",), False)])
def test_the_profiles_run_every_trial_to_its_end_unless_asked(flags, on):
    from search.run import check_inputs, parse_args

    for profile in ("cpu", "gpu"):
        args = parse_args(["--profile", profile, "--no-probe", "--objective", "mlm", "--estimate", *flags])
        early_stop = check_inputs(args).early_stop
        assert (early_stop is not None) == on
        if on:
            assert early_stop["grace_reports"] >= 1 and early_stop["min_trials"] >= 1
