"""Each vocabulary is defined once (issue 40, item 5).

The architecture's names live in `space.vocabulary`: the model's registries, ArchConfig, the
search-space grammar and the FLOP count all read them, and no other module keeps its own list.
A budget string is read by one function, `trainer.budget.Budget.parse`, once on its way from
a command line to the trial that trains under it.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from search.study.spec import TrialSpec
from space import SpaceError, load_space
from space.arch import CHOICES, ELEMENTWISE_OPS, ArchConfig, ArchError
from space.vocabulary import FFN_ACTIVATION, VOCABULARIES, Activation, FfnKind, NormKind, NormPlacement, Position
from trainer import model as M
from trainer import resume
from trainer.budget import Budget
from trainer.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("space", "trainer", "search", "glue", "dashboards")


# ---- the architecture's vocabulary ---------------------------------------------------------------

@pytest.mark.parametrize(("registry", "vocabulary"), [
    (M.POSITIONS, Position), (M.NORMS, NormKind), (M.RESIDUALS, NormPlacement), (M.ACTIVATIONS, Activation),
], ids=["positions", "norms", "residuals", "activations"])
def test_each_model_registry_holds_exactly_its_vocabulary(registry, vocabulary):
    assert set(registry) == {name.value for name in vocabulary}


def test_every_ffn_kind_has_an_activation_and_every_op_a_cost():
    assert set(FFN_ACTIVATION) == set(FfnKind)  # make_ffn and the FLOP count both read it
    assert set(Activation) | set(NormKind) <= set(ELEMENTWISE_OPS)


def test_arch_config_and_search_spaces_take_the_vocabulary_and_store_plain_strings():
    assert CHOICES == {field: tuple(name.value for name in vocabulary) for field, vocabulary in VOCABULARIES.items()}
    arch = ArchConfig(hidden=64, heads=4, position=Position.ROTARY, ffn_kind=FfnKind.SWIGLU)
    assert type(arch.position) is str and arch == ArchConfig(hidden=64, heads=4, position="rotary", ffn_kind="swiglu")
    with pytest.raises(ArchError, match=r"^position: 'rotery' is not one of learned, sinusoidal, scaled_sinusoidal, "
                                        r"rotary, alibi, none$"):
        ArchConfig(position="rotery")


def space_with(field: str, values: list[str]) -> str:
    return (f"name: one\nfixed: {{vocab_size: 512, max_seq_len: 32}}\n"
            f"params:\n  hidden: {{choice: [64]}}\n  heads: {{choice: [4]}}\n  {field}: {{choice: [{', '.join(values)}]}}\n")


@pytest.mark.parametrize("field", sorted(VOCABULARIES))
def test_a_space_may_choose_any_name_and_a_misspelt_one_is_one_line_naming_the_field(field, tmp_path):
    names = list(CHOICES[field])
    path = tmp_path / "space.yaml"
    path.write_text(space_with(field, names))
    assert load_space(path).params[field].options == tuple(names)
    path.write_text(space_with(field, [names[0], names[1] + "x"]))
    with pytest.raises(SpaceError) as caught:
        load_space(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"space.yaml: params.{field}.choice: '{names[1]}x' is not a {field};")
    assert message.endswith(f"{field} takes one of {', '.join(names)}")


def strings_in(nodes) -> set[str]:
    return {node.value for node in nodes if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def test_no_module_keeps_its_own_list_of_a_vocabulary_or_compares_with_a_string():
    """A literal tuple, list, set or dict holding two names of one vocabulary is a second
    definition: it would miss a name added to space.vocabulary. Nor is a categorical field compared
    with a string of its own (`arch.position == "rotary"`): code names the member."""
    vocabularies = {vocabulary.__name__: {name.value for name in vocabulary}
                    for vocabulary in (*VOCABULARIES.values(), Activation)}
    found = []
    for path in sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py")):
        if path == ROOT / "space" / "vocabulary.py":
            continue
        where = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                strings = strings_in(node.keys if isinstance(node, ast.Dict) else node.elts)
                found += [f"{where}:{node.lineno} lists {vocabulary}"
                          for vocabulary, names in vocabularies.items() if len(strings & names) >= 2]
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                field = any(isinstance(side, ast.Attribute) and side.attr in VOCABULARIES for side in sides)
                flat = [item for side in sides for item in getattr(side, "elts", [side])]
                if field and strings_in(flat):
                    found.append(f"{where}:{node.lineno} compares with a string")
    assert not found, f"vocabulary names outside space/vocabulary.py: {found}"


# ---- the budget ----------------------------------------------------------------------------------

@pytest.fixture
def parsed(monkeypatch) -> list[str]:
    """Every text `Budget.parse` reads from now on, in order."""
    texts: list[str] = []
    parse = Budget.parse.__func__

    def counting(cls, text):
        texts.append(text)
        return parse(cls, text)

    monkeypatch.setattr(Budget, "parse", classmethod(counting))
    return texts


def test_search_run_parses_the_budget_once_into_the_trial_spec(parsed, monkeypatch):
    import search.run as run

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    checked = run.check_inputs(run.parse_args(["--profile", "cpu", "--budget", "2e12flops", "--estimate"]))
    assert parsed == ["2e12flops"] and checked.budget == Budget("flops", 2e12, "2e12flops")
    spec = TrialSpec(checked.train, checked.budget, "data")  # search.run.make_plan's template
    # Through Ray a spec is plain values: the worker rebuilds the budget from its text, once.
    assert TrialSpec.from_dict(json.loads(json.dumps(spec.to_dict()))).budget == checked.budget
    assert parsed == ["2e12flops", "2e12flops"]


def test_trainer_cram_parses_the_budget_once(parsed, tmp_path):
    from trainer import cram

    config = ROOT / "trainer" / "configs" / "sized-cpu.yaml"
    args = cram.parse_arguments(["--config", str(config), "--budget", "2e12flops", "--out", str(tmp_path / "run"),
                                 "--checkpoint-every", "off", "--validate-every", "off"])
    budget = cram.settle_run(args)[2]
    assert parsed == ["2e12flops"] and budget == Budget("flops", 2e12, "2e12flops")


def test_a_resumed_run_parses_only_the_checkpoints_record(parsed):
    arch, train = ArchConfig(layers=1, hidden=32, heads=2), TrainConfig()
    budget = Budget("tokens", 2e4, "20000tokens")  # as the command line gave it, already typed
    saved = {**resume.run_record(arch, train, budget, "data"), "budget": "2e4tokens"}  # same amount, other text
    resume.check_same_run(saved, arch, train, budget, "data", Path("step-1"))
    assert parsed == ["2e4tokens"]


def test_no_module_but_trainer_budget_reads_a_budget_string_itself():
    """Unit suffixes are trainer.budget's: no other module tests a string for them (`.endswith("flops")`)."""
    from trainer.budget import NAMED_BUDGETS, UNITS

    units = {*UNITS, *NAMED_BUDGETS}
    methods = {"endswith", "startswith", "removesuffix", "removeprefix", "rstrip", "lstrip", "strip", "split",
               "rsplit", "partition", "rpartition", "replace"}
    found = []
    for path in sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py")):
        if path == ROOT / "trainer" / "budget.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in methods:
                arguments = [a for arg in node.args for a in (arg.elts if isinstance(arg, ast.Tuple) else [arg])]
                if any(isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.strip().lower() in units
                       for a in arguments):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"budget text inspected outside trainer/budget.py: {found}"
