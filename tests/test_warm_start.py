"""A study's first draw (search/study/warm_start.py, space/design.py): the profile's hand designs are
members of its space and trained first, then a covering design trains every value of every choice
and bool before the controller models anything."""

from __future__ import annotations

import random

import optuna
import pytest
import yaml

from search.base import attrs
from search.study.controllers import CONTROLLERS, ask, open_study, tell
from search.study.warm_start import describe_first_draw, hand_designs, parse_spec, search_verdict, warm_starts
from space import load_space
from space.design import categorical_params, covering_design, covering_size, optuna_params, uncovered
from space.errors import UsageError
from space.search_space import default_space_path

optuna.logging.set_verbosity(optuna.logging.WARNING)
CPU = load_space(default_space_path("cpu"))


@pytest.mark.parametrize("profile", ["cpu", "gpu"])
def test_every_hand_design_of_a_profile_is_a_member_of_its_space(profile):
    space = load_space(default_space_path(profile))
    designs = hand_designs(profile)
    assert len(designs) >= 3
    for name, config in designs:
        assert space.validate(config) is None, name


def run(study, space, trials, score=lambda config: random.random()):
    configs = []
    for _ in range(trials):
        proposal = ask(study, space)
        configs.append(proposal)
        tell(study, proposal.number, [score(proposal.config)])
    return configs


@pytest.mark.parametrize("controller", sorted(CONTROLLERS))
def test_a_16_trial_study_trains_the_hand_designs_then_every_value_of_every_choice(controller):
    random.seed(0)
    study = open_study("s", None, controller, "mlm", CPU, seed=0, warm_starts=hand_designs("cpu"), cover=True)
    proposals = run(study, CPU, 16)
    assert [p.warm_start for p in proposals[:4]] == ["sized-cpu", "neobert-cpu", "modernbert-cpu", "crammed-bert-cpu"]
    assert [p.config for p in proposals[:4]] == [config for _, config in hand_designs("cpu")]
    first = 4 + covering_size(CPU)
    assert all(p.first_draw == "cover" for p in proposals[4:first]) and proposals[first].first_draw is None
    assert uncovered(CPU, [p.config for p in proposals]) == {}
    assert study.user_attrs[attrs.STARTUP] == first
    assert "4 warm starts (sized-cpu, neobert-cpu" in describe_first_draw(study)


def test_without_the_first_draw_a_16_trial_tpe_study_leaves_values_untried():
    """What the covering design is for: the same study without it misses values (seed 0)."""
    study = open_study("s", None, "tpe", "mlm", CPU, seed=0)
    assert uncovered(CPU, [p.config for p in run(study, CPU, 16)])


def test_a_study_shorter_than_its_first_draw_queues_only_its_own_trials():
    study = open_study("s", None, "tpe", "mlm", CPU, seed=0, warm_starts=hand_designs("cpu"), cover=True, trials=3)
    assert [p.warm_start for p in run(study, CPU, 3)] == ["sized-cpu", "neobert-cpu", "modernbert-cpu"]
    assert study.get_trials(states=(optuna.trial.TrialState.WAITING,)) == []  # nothing left to inflate the counts
    assert study.user_attrs[attrs.STARTUP] == 3


def test_the_samplers_model_only_after_the_first_draw_and_a_resume_keeps_it(tmp_path):
    url = f"sqlite:///{tmp_path}/optuna.db"
    study = open_study("s", url, "tpe", "mlm", CPU, seed=0, warm_starts=hand_designs("cpu"), cover=True)
    assert study.sampler._n_startup_trials == 4 + covering_size(CPU)
    resumed = open_study("s", url, "tpe", "mlm", CPU, seed=0, resume=True)
    assert resumed.sampler._n_startup_trials == 4 + covering_size(CPU)
    evolution = open_study("e", None, "evolution", "mlm", CPU, seed=0, warm_starts=hand_designs("cpu"), cover=True)
    assert evolution.sampler.population_size >= 4 + covering_size(CPU)


def test_covering_size_follows_from_the_space(tmp_path):
    document = yaml.safe_load(default_space_path("cpu").read_text())
    document["params"]["init_std"] = {"choice": [0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.05]}
    path = tmp_path / "wide.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    wide = load_space(path)
    assert covering_size(CPU) == max(len(options) for options in categorical_params(CPU).values()) == 7
    assert covering_size(wide) == 9
    design = covering_design(wide, random.Random(3))
    assert len(design) == 9 and uncovered(wide, design) == {}


def test_a_large_design_is_balanced_and_latin():
    design = covering_design(CPU, random.Random(0), rows=60)
    assert len({config.fingerprint() for config in design}) == 60
    positions = [config.position for config in design]
    assert all(positions.count(value) == 10 for value in set(positions))  # 6 options, 60 rows
    layers = [config.layers for config in design]
    assert all(layers.count(value) == 15 for value in range(1, 5))  # 4 strata of 15 rows


def test_enqueued_parameters_replay_the_design():
    for config in covering_design(CPU, random.Random(1)):
        study = optuna.create_study()
        study.enqueue_trial(optuna_params(CPU, config))
        assert ask(study, CPU).config == config


def test_warm_start_from_the_top_of_an_earlier_study(tmp_path):
    url = f"sqlite:///{tmp_path}/optuna.db"
    earlier = open_study("short", url, "random", "mlm", CPU, seed=0)
    proposals = run(earlier, CPU, 6, score=lambda config: config.num_params())  # lowest loss: the smallest
    best = sorted(proposals, key=lambda p: p.config.num_params())[:2]
    chosen = warm_starts("study:short:2", {}, CPU, url)
    assert chosen == [(f"study:short#{p.number}", p.config) for p in best]
    assert len(warm_starts("study:short", {}, CPU, url)) == 5


@pytest.mark.parametrize("spec,message", [("bogus", "not one of profile, none"), ("study:", "not one of"),
                                          ("study:x:0", "K must be a whole number"), ("study:x:two", "K must be")])
def test_a_bad_warm_start_is_one_line_naming_the_flag(spec, message):
    with pytest.raises(UsageError, match=message) as error:
        parse_spec(spec)
    assert str(error.value).startswith("--warm-start") and "\n" not in str(error.value)


def test_an_unknown_study_and_a_non_member_are_said(tmp_path):
    with pytest.raises(UsageError, match="study nobody not found"):
        warm_starts("study:nobody", {}, CPU, f"sqlite:///{tmp_path}/optuna.db")
    tiny = load_space(default_space_path("gpu"))
    said = []
    assert warm_starts("profile", {"warm_start": ["sized-cpu"]}, tiny, warn=said.append) == []
    assert len(said) == 1 and "sized-cpu left out: not a member" in said[0]
    assert warm_starts("none", {"warm_start": ["sized-cpu"]}, CPU) == []


def test_a_study_says_when_its_best_trial_is_of_the_first_draw():
    warm_best = [(0, 5.04, " (warm start sized-cpu)"), (14, 5.53, ""), (4, 5.6, " (cover)"), (20, 5.7, "")]
    line = search_verdict(warm_best, "validation_loss")
    assert line.startswith("the search found nothing better than its first draw in 2 trials of its own")
    assert "trial 0 (warm start sized-cpu)" in line and "trial 14, is 0.490 behind" in line
    own_best = [(21, 4.155, ""), (0, 5.042, " (warm start sized-cpu)")]
    assert search_verdict(own_best, "validation_loss") == (
        "the search beat its first draw: trial 21, the controller's, is 0.887 ahead by validation_loss of the first "
        "draw's best, trial 0 (warm start sized-cpu)")
    assert search_verdict([(0, 5.0, " (cover)")], "validation_loss") is None  # the controller has not drawn yet
