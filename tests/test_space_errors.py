"""Every mistake in a space file is a one-line SpaceError at load time naming the file and the key."""

import pytest

from space import SpaceError, load_space

FIXED = "{vocab_size: 1000, max_seq_len: 64}"
PARAMS = """
  layers: {int: [1, 3]}
  hidden: {choice: [64, 128]}
  heads: {choice: [2, 4], when: "hidden % heads == 0"}
"""
CONSTRAINTS = '["params_millions <= 10"]'


def space_text(params: str = PARAMS, fixed: str = FIXED, constraints: str = CONSTRAINTS, top: str = "name: bad") -> str:
    return f"{top}\nfixed: {fixed}\nparams:{params}\nconstraints: {constraints}\n"


def load_error(tmp_path, text: str) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpaceError) as caught:
        load_space(path)
    message = str(caught.value)
    assert message.startswith("bad.yaml: ") and "\n" not in message, message
    assert "; " in message, message  # problem; fix
    return message


def test_the_template_itself_loads(tmp_path):
    path = tmp_path / "good.yaml"
    path.write_text(space_text())
    assert list(load_space(path).params) == ["layers", "hidden", "heads"]


def test_missing_file(tmp_path):
    with pytest.raises(SpaceError) as caught:
        load_space(tmp_path / "nowhere.yaml")
    assert str(caught.value).startswith("nowhere.yaml: file: not found at ")


def test_yaml_syntax_error(tmp_path):
    message = load_error(tmp_path, "name: bad\nparams:\n  layers: {int: [1, 3]\n")
    assert "line 4" in message and "YAML syntax error" in message


CASES = {
    # name: (file text, key in the message, more words the message must hold)
    "not a mapping": ("- 1\n- 2\n", "top level", "expected a mapping"),
    "unknown top-level key": (space_text(top="name: bad\nparms: {}"), "parms", "did you mean 'params'"),
    "missing name": (space_text(top="description: no name"), "name", "missing"),
    "missing params": ("name: bad\nfixed: {layers: 2}\n", "params", "missing"),
    "empty params": ("name: bad\nparams: {}\n", "params", "got an empty one"),
    "unknown parameter": (space_text(PARAMS + "  hiden: {choice: [1]}\n"), "params.hiden",
                          "did you mean 'hidden'? allowed: layers, hidden"),
    "unknown fixed field": (space_text(fixed="{vocab: 1000}"), "fixed.vocab", "did you mean 'vocab_size'"),
    "spec not a mapping": (space_text(PARAMS + "  qkv_bias: bool\n"), "params.qkv_bias", "expected a mapping"),
    "spec a bare list": (space_text("\n  layers: [1, 3]\n"), "params.layers", "{int: [low, high]}"),
    "no kind": (space_text(PARAMS + "  qkv_bias: {when: 'layers > 1'}\n"), "params.qkv_bias", "no kind"),
    "two kinds": (space_text("\n  layers: {int: [1, 3], choice: [1, 2]}\n"), "params.layers",
                  "two kinds (int, choice)"),
    "unknown modifier": (space_text("\n  layers: {int: [1, 3], stepp: 2}\n"), "params.layers.stepp",
                         "did you mean 'step'"),
    "modifier of another kind": (space_text("\n  layers: {choice: [1, 3], step: 2}\n"), "params.layers.step",
                                 "does not apply to choice"),
    "kind that does not fit the field": (space_text(PARAMS + "  ffn_mult: {int: [2, 4]}\n"),
                                         "params.ffn_mult.int", "{float: [low, high]}"),
    "bool with a value": (space_text(PARAMS + "  qkv_bias: {bool: yes}\n"), "params.qkv_bias.bool", "{bool}"),
    "empty choice": (space_text("\n  layers: {choice: []}\n"), "params.layers.choice", "non-empty list"),
    "duplicate choice": (space_text("\n  layers: {choice: [1, 2, 1]}\n"), "params.layers.choice", "listed twice"),
    "choice of the wrong type": (space_text(PARAMS + "  ffn_mult: {choice: [2, x]}\n"),
                                 "params.ffn_mult.choice", "'x' is not a finite number; ffn_mult takes numbers"),
    "integer choice given a float": (space_text("\n  layers: {choice: [2, 2.5]}\n"), "params.layers.choice",
                                     "2.5 is not an integer; layers takes integers"),
    "bool choice given a number": (space_text(PARAMS + "  qkv_bias: {choice: [1, 0]}\n"),
                                   "params.qkv_bias.choice", "takes true or false"),
    "str value not among the choices": (space_text(PARAMS + "  ffn_kind: {choice: [gelu, swiglo]}\n"),
                                        "params.ffn_kind.choice", "'swiglo' is not a ffn_kind; did you mean 'swiglu'"),
    "fixed value of the wrong type": (space_text(fixed="{vocab_size: 1000, norm_eps: 1e-12}"),
                                      "fixed.norm_eps", "write 1.0e-12"),
    "int range of one number": (space_text("\n  layers: {int: [3]}\n"), "params.layers.int", "two integers"),
    "int range of floats": (space_text("\n  layers: {int: [1.5, 3]}\n"), "params.layers.int", "two integers"),
    "int range reversed": (space_text("\n  layers: {int: [6, 2]}\n"), "params.layers.int",
                           "low 6 is above high 2; write [2, 6]"),
    "float range reversed": (space_text(PARAMS + "  ffn_mult: {float: [4.0, 2.0]}\n"), "params.ffn_mult.float",
                             "low 4.0 is above high 2.0"),
    "float range not finite": (space_text(PARAMS + "  ffn_mult: {float: [2.0, .inf]}\n"),
                               "params.ffn_mult.float", "finite"),
    "log from zero": (space_text(PARAMS + "  init_std: {float: [0.0, 0.1], log: true}\n"), "params.init_std.log",
                      "low > 0"),
    "log not a bool": (space_text(PARAMS + "  init_std: {float: [0.01, 0.1], log: 2}\n"), "params.init_std.log",
                       "true or false"),
    "int step not dividing the range": (space_text("\n  layers: {int: [2, 7], step: 2}\n"), "params.layers.step",
                                        "2 does not divide the range [2, 7]"),
    "float step not dividing the range": (space_text(PARAMS + "  ffn_mult: {float: [2.0, 4.0], step: 0.75}\n"),
                                          "params.ffn_mult.step", "does not divide"),
    "step not positive": (space_text("\n  layers: {int: [2, 6], step: 0}\n"), "params.layers.step", "positive"),
    "int step with log": (space_text("\n  layers: {int: [2, 6], step: 2, log: true}\n"), "params.layers.step",
                          "step and log together"),
    "float step with log": (space_text(PARAMS + "  ffn_mult: {float: [2.0, 4.0], step: 0.5, log: true}\n"),
                            "params.ffn_mult.step", "step and log together"),
    "field both fixed and searched": (space_text(fixed="{vocab_size: 1000, layers: 2}"), "params.layers",
                                      "also under fixed"),
    "invalid fixed value": (space_text(fixed="{vocab_size: 3}"), "fixed.vocab_size", "5 BERT special tokens"),
    "negative local window": (space_text(fixed="{vocab_size: 1000, local_window: -1}"), "fixed.local_window",
                              "must not be negative, got -1; write 0 for global attention in every layer"),
    "global_every below 1": (space_text(fixed="{vocab_size: 1000, global_every: 0}"), "fixed.global_every",
                             "must be at least 1, got 0; write 1 for every layer global"),
    "fixed values that clash": (space_text("\n  layers: {int: [1, 3]}\n", fixed="{hidden: 100, heads: 12}"),
                                "fixed.heads", "not divisible"),
    "when with a syntax error": (space_text(PARAMS + "  qkv_bias: {bool, when: 'layers >'}\n"),
                                 "params.qkv_bias.when", "not a valid expression"),
    "when calling __import__": (space_text(PARAMS + "  qkv_bias: {bool, when: \"__import__('os')\"}\n"),
                                "params.qkv_bias.when", "'__import__'"),
    "when reading an attribute": (space_text(PARAMS + "  qkv_bias: {bool, when: 'hidden.real > 1'}\n"),
                                  "params.qkv_bias.when", "not allowed"),
    "when not a string": (space_text(PARAMS + "  qkv_bias: {bool, when: true}\n"), "params.qkv_bias.when",
                          "expected an expression string"),
    "when naming an unknown name": (space_text(PARAMS + "  qkv_bias: {bool, when: 'layrs > 1'}\n"),
                                    "params.qkv_bias.when", "unknown name 'layrs'; did you mean 'layers'"),
    "when naming a later parameter": (space_text("\n  qkv_bias: {bool, when: 'layers > 1'}" + PARAMS),
                                      "params.qkv_bias.when", "'layers', which is drawn later"),
    "when naming an unmentioned field": (space_text(PARAMS + "  qkv_bias: {bool, when: 'ffn_mult > 1'}\n"),
                                         "params.qkv_bias.when", "neither fixed nor a parameter"),
    "option filter on an int": (space_text("\n  layers: {int: [1, 3], when: 'layers > 1'}\n"),
                                "params.layers.when", "choice or bool"),
    "option filter that can leave nothing": (
        space_text("\n  hidden: {choice: [100, 128]}\n  heads: {choice: [8, 16], when: 'hidden % heads == 0'}\n"),
        "params.heads", "no choice of [8, 16] satisfies 'hidden % heads == 0' when hidden=100"),
    "option filter that cannot be evaluated": (
        space_text("\n  hidden: {choice: [64]}\n  heads: {choice: [2], when: 'hidden % (heads - 2) == 0'}\n"),
        "params.heads.when", "ZeroDivisionError"),
    "constraints not a list": (space_text(constraints="params_millions <= 10"), "constraints", "a list"),
    "constraint with a syntax error": (space_text(constraints='["params_millions <="]'), "constraints[0]",
                                       "not a valid expression"),
    "constraint naming an unknown name": (space_text(constraints='["layers > 0", "param_millions < 3"]'),
                                          "constraints[1]", "did you mean 'params_millions'"),
    "infeasible constraints": (space_text(constraints='["params_millions <= 0.001"]'), "constraints",
                               "no valid point in 2000 draws (last reason: violates 'params_millions <= 0.001')"),
    "no valid architecture": (space_text("\n  hidden: {choice: [62, 126]}\n", "{heads: 2, position: rotary}", "[]"),
                              "params", "rotary needs an even head dim"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_space_files(tmp_path, case):
    text, key, words = CASES[case]
    message = load_error(tmp_path, text)
    assert message.startswith(f"bad.yaml: {key}: "), message
    assert words in message, message


def test_fixed_values_are_judged_with_the_searched_ones(tmp_path):
    # heads=5 does not divide the default hidden=768, but every searched hidden is fine.
    path = tmp_path / "fine.yaml"
    path.write_text(space_text("\n  hidden: {choice: [320, 640]}\n", fixed="{heads: 5}", constraints="[]"))
    assert load_space(path).params["hidden"].options == (320, 640)
