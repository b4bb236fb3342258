"""The search space: safe expressions, the shipped spaces, drawing (random, Optuna), mutation."""

import random
import re
from dataclasses import fields

import optuna
import pytest
import yaml

from space import ArchConfig, OptunaDraws, RandomDraw, SearchSpace, SpaceError, default_space_path, load_space, mutate
from space.expr import Expr, ExprError

optuna.logging.set_verbosity(optuna.logging.WARNING)
PROFILES = ("cpu", "gpu")
# Which fields a change of the key field may drag along: heads is filtered by hidden, and
# final_norm is filtered to false under post-norm (which already ends in a norm).
DEPENDENTS = {"hidden": {"heads"}, "norm_placement": {"final_norm"}, "local_window": {"global_every"}}


@pytest.fixture(scope="module", params=PROFILES)
def space(request) -> SearchSpace:
    return load_space(default_space_path(request.param))


def write(tmp_path, text: str, name: str = "test.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


# ---- expressions ---------------------------------------------------------------------------------
@pytest.mark.parametrize("source, expected", [
    ("hidden % heads == 0", True),
    ("hidden // heads + 1", 33),
    ("-layers ** 2 + +layers", -12),
    ("hidden / 4 * 2 - 1", 127.0),
    ("2 ** -1", 0.5),
    ("1 < layers <= 4 < hidden", True),
    ("3 < layers < 2", False),
    ("position in ['rotary', 'alibi']", True),
    ("position not in ('rotary',)", False),
    ("not flag and layers > 1 or false", False),
    ("flag or 0", True),
    ("true and not false", True),
    ("None == None", True),
    ("'big' if hidden > 128 else 'small'", "big"),
    ("min(layers, 3) + max(1, 2) + abs(-2) + round(2.6)", 10),
    ("round(params_millions, 1)", 7.4),
])
def test_expressions_evaluate(source, expected):
    env = {"hidden": 256, "heads": 8, "layers": 4, "position": "rotary", "flag": True, "params_millions": 7.36}
    assert Expr(source).evaluate(env) == expected


def test_expression_names_are_the_free_names():
    expr = Expr("max(hidden, 2) > heads if true else None")
    assert expr.names == {"hidden", "heads"}
    assert expr.source == "max(hidden, 2) > heads if true else None"


@pytest.mark.parametrize("source", [
    "__import__('os')", "hidden.bit_length()", "hidden.real", "[1, 2][0]", "(lambda: 1)()",
    "[h for h in [1, 2]]", "{1, 2}", "{'a': 1}", "open('x')", "hidden is None", "f'{hidden}'",
    "x := 3", "__builtins__", "max(*[1, 2])", "b'bytes'", "1j", "hidden % ", "",
])
def test_expressions_refuse_anything_else(source):
    with pytest.raises(ExprError) as caught:
        Expr(source)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("source, env, words", [
    ("hiden > 1", {"hidden": 2}, ["'hiden'", "did you mean 'hidden'"]),
    ("2 ** exponent", {"exponent": 100}, ["exponent 100", "64"]),
    ("hidden // heads", {"hidden": 2, "heads": 0}, ["ZeroDivisionError"]),
    ("hidden + 'a'", {"hidden": 2}, ["TypeError"]),
])
def test_expression_evaluation_errors_are_clear(source, env, words):
    with pytest.raises(ExprError) as caught:
        Expr(source).evaluate(env)
    for word in words:
        assert word in str(caught.value)


# ---- the shipped spaces ----------------------------------------------------------------------------
def test_shipped_spaces_mention_every_field(space):
    mentioned = set(space.fixed) | set(space.params)
    assert mentioned == {f.name for f in fields(ArchConfig)}


def test_random_samples_are_valid_members(space):
    rng = random.Random(0)
    for _ in range(300):
        config = space.sample_random(rng)
        assert space.validate(config) is None
        assert config.hidden % config.heads == 0
        assert config.vocab_size == space.fixed["vocab_size"]
        if config.norm_placement == "post":  # the option filter leaves only false
            assert config.final_norm is False


def test_random_samples_reproduce_with_the_seed(space):
    first = [space.sample_random(random.Random(7)) for _ in range(3)]
    rng_a, rng_b = random.Random(11), random.Random(11)
    assert [space.sample_random(rng_a) for _ in range(20)] == [space.sample_random(rng_b) for _ in range(20)]
    assert first[0] == first[1] == first[2]


def test_random_samples_explore_the_space():
    space = load_space(default_space_path("cpu"))
    rng = random.Random(0)
    configs = [space.sample_random(rng) for _ in range(300)]
    for field in ("layers", "hidden", "heads", "ffn_mult", "ffn_kind", "position", "final_norm"):
        assert len({getattr(c, field) for c in configs}) > 1, field
    assert {c.ffn_mult for c in configs} == {2.0 + 0.25 * k for k in range(9)}  # the grid of step 0.25, all of it
    assert max(c.num_params() for c in configs) <= 8e6


def test_default_space_path_names_the_profiles():
    assert default_space_path("cpu").name == "crammed_bert_cpu.yaml"
    with pytest.raises(ValueError, match="cpu, gpu"):
        default_space_path("tpu")


def test_validate_names_what_is_not_a_member(tmp_path):
    # The CPU space with a tighter size bound than its own (every draw of which fits in 3M).
    definition = yaml.safe_load(default_space_path("cpu").read_text())
    definition["constraints"] = ["params_millions <= 1"]
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(definition, sort_keys=False))
    space = load_space(tmp_path / "space.yaml")
    member = space.sample_random(random.Random(0)).replace(norm_placement="post", final_norm=False, layers=1,
                                                            hidden=64, heads=2)
    assert space.contains(member)
    assert "layers" in space.validate(member.replace(layers=16))
    assert "vocab_size" in space.validate(member.replace(vocab_size=32768))
    assert "final_norm" in space.validate(member.replace(final_norm=True))  # filtered out under post
    big = member.replace(layers=4, hidden=192, heads=4, ffn_mult=4.0, ffn_kind="gelu", tie_embeddings=False)
    assert "violates 'params_millions <= 1'" in space.validate(big)


# ---- Optuna -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("sampler", [
    optuna.samplers.TPESampler(seed=0, n_startup_trials=10),
    optuna.samplers.NSGAIISampler(seed=0, population_size=10),
], ids=["tpe", "nsga2"])
def test_optuna_samplers_drive_the_cpu_space(sampler):
    space = load_space(default_space_path("cpu"))
    study = optuna.create_study(sampler=sampler)
    for _ in range(30):
        config, draw = space.sample(OptunaDraws(study))
        assert space.contains(config)
        assert draw.trial.params["layers"] == config.layers
        assert ("final_norm" in draw.trial.params) == (config.norm_placement != "post")
        study.tell(draw.trial, config.num_params() / 1e6)
    assert len(study.get_trials(states=[optuna.trial.TrialState.COMPLETE])) == 30


def test_optuna_labels_are_unique_per_option_subset():
    space = load_space(default_space_path("gpu"))  # 256 and 512 are not divisible by 12 heads
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=5))
    labels = {}
    for _ in range(30):
        config, draw = space.sample(OptunaDraws(study))
        label = next(name for name in draw.trial.params if name.startswith("heads"))
        labels.setdefault(config.hidden, set()).add(label)
        study.tell(draw.trial, float(config.layers))
    assert labels.get(768, {"heads"}) == labels.get(384, {"heads"}) == {"heads"}
    assert labels.get(256, {"heads[4,8,16]"}) == labels.get(512, {"heads[4,8,16]"}) == {"heads[4,8,16]"}
    assert len(set().union(*labels.values())) == 2


def test_rejected_optuna_trials_are_pruned_and_marked_infeasible(tmp_path):
    space = load_space(write(tmp_path, """
name: tight
params:
  layers: {int: [1, 8]}
constraints: ["layers >= 7"]
"""))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(5):
        config, draw = space.sample(OptunaDraws(study))
        study.tell(draw.trial, 0.0)
    pruned = study.get_trials(states=[optuna.trial.TrialState.PRUNED])
    assert pruned, "a 1-in-4 constraint should reject some draws"
    assert all(t.user_attrs["infeasible"] == "violates 'layers >= 7'" for t in pruned)
    complete = study.get_trials(states=[optuna.trial.TrialState.COMPLETE])
    assert all("infeasible" not in t.user_attrs and t.params["layers"] >= 7 for t in complete)


class LowestDraw(RandomDraw):
    """Always the lowest integer: a controller stuck in an infeasible corner."""

    def integer(self, field, label, low, high, step, log):
        return low


def test_sample_gives_up_with_a_space_error(tmp_path):
    space = load_space(write(tmp_path, "name: t\nparams: {layers: {int: [1, 2]}}\nconstraints: ['layers > 1']\n"))
    with pytest.raises(SpaceError, match=r"test.yaml: constraints: no valid point in 5 draws \(last reason: "
                                         r"violates 'layers > 1'\); relax"):
        space.sample(lambda: LowestDraw(random.Random(0)), max_attempts=5)


# ---- mutation --------------------------------------------------------------------------------------
DESCRIPTION = re.compile(r"^(\w+): (\S+) -> (\S+)(?: \((\w+: \S+ -> \S+)(?:, \w+: \S+ -> \S+)*\))?$")


def test_mutations_change_one_parameter_and_its_dependents(space):
    rng = random.Random(0)
    parent = space.sample_random(rng)
    for _ in range(200):
        before = parent.to_dict()
        child, description = mutate(space, parent, rng)
        assert parent.to_dict() == before
        assert space.validate(child) is None, description
        match = DESCRIPTION.match(description)
        assert match, description
        target = match.group(1)
        changed = {f for f, value in child.to_dict().items() if before[f] != value}
        assert target in changed
        assert changed - {target} <= DEPENDENTS.get(target, set()), description
        parent = child


def test_mutation_describes_dependent_changes():
    space = load_space(default_space_path("gpu"))
    parent = space.sample_random(random.Random(0)).replace(hidden=768, heads=12, layers=4)
    rng = random.Random(0)
    for _ in range(2000):
        child, description = mutate(space, parent, rng)
        if child.hidden in (256, 512):  # 12 heads do not divide these: heads must be redrawn
            assert description.startswith(f"hidden: 768 -> {child.hidden} (heads: 12 -> {child.heads}")
            assert child.heads in (4, 8, 16)
            return
    pytest.fail("no mutation of hidden to 256 or 512 in 2000 tries")


def test_mutation_refuses_non_members():
    space = load_space(default_space_path("cpu"))
    with pytest.raises(SpaceError, match="crammed_bert_cpu.yaml: mutation: the parent is not in the space"):
        mutate(space, ArchConfig(), random.Random(0))


def test_describe_names_the_choices_that_tell_models_apart():
    arch = ArchConfig(layers=4, hidden=256, heads=4, ffn_kind="swiglu", norm_placement="post", position="rotary")
    assert arch.describe() == "4x256/4h swiglu post-norm rotary"
    assert ArchConfig().describe() == "16x768/12h geglu pre-norm scaled_sinusoidal"
    assert arch.replace(local_window=16, global_every=3).describe() == \
        "4x256/4h swiglu post-norm rotary window 16/global every 3"
    assert arch.replace(tie_embeddings=False).describe() == "4x256/4h swiglu post-norm rotary untied"


def test_a_space_may_search_sliding_window_attention(tmp_path):
    space = load_space(write(tmp_path, """
name: windows
fixed: {vocab_size: 1000, max_seq_len: 64, hidden: 64, heads: 2}
params:
  layers: {int: [1, 4]}
  local_window: {choice: [0, 8, 16]}
  global_every: {choice: [2, 3], when: "local_window > 0"}
"""))
    configs = [space.sample_random(random.Random(seed)) for seed in range(60)]
    assert {c.local_window for c in configs} == {0, 8, 16}
    assert {c.global_every for c in configs if c.local_window} == {2, 3}
    assert {c.global_every for c in configs if not c.local_window} == {1}  # not drawn: the default


def test_fingerprints_of_architectures_from_before_windows_are_unchanged():
    # Recorded by studies and MLflow runs before local_window and global_every existed.
    assert ArchConfig().fingerprint() == "9325c88d2659"
    small = ArchConfig(layers=2, hidden=128, heads=2, vocab_size=2048, max_seq_len=64, position="rotary")
    assert small.fingerprint() == "c3d6356204ac"
    assert small.replace(local_window=16, global_every=3).fingerprint() != "c3d6356204ac"


def test_a_window_that_changes_no_layer_is_one_network_with_one_fingerprint():
    small = ArchConfig(layers=2, hidden=128, heads=2, vocab_size=2048, max_seq_len=64, position="rotary")
    moot = [small.replace(layers=1).replace(local_window=16, global_every=3),  # its one layer is global
            small.replace(local_window=16),  # global_every 1: every layer global
            small.replace(global_every=3),  # no window
            small.replace(local_window=63, global_every=2)]  # the window reaches every key of a row
    for arch in moot:
        plain = small.replace(layers=arch.layers)
        assert arch.canonical() == plain and arch.fingerprint() == plain.fingerprint()
        assert "window" not in arch.describe()
    # A layer that is local keeps every window field, and the fingerprint studies recorded for it.
    two = small.replace(local_window=16, global_every=2)
    assert two.canonical() == two and two.fingerprint() == "a0566c6fbc52"
    assert small.replace(local_window=16, global_every=3).fingerprint() == "a0a81ded9199"
    assert small.replace(layers=4, local_window=16, global_every=3).fingerprint() == "ea380d46ac3a"
    assert two.describe().endswith("window 16/global every 2")
