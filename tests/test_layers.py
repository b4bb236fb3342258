"""The packages stay layered and free of import cycles.

The layers, lowest first: space <- trainer <- glue <- search <- dashboards. A module may import
its own package and the packages below it, never one above: space imports none of the others,
trainer only space, glue space and trainer, search those three, dashboards any of them. Every
import counts here, function-level ones too: a lazy import still makes the lower package need
the upper one (a trainer that can only record its run with search installed is not a layer).

Inside a package, the modules' imports must form no cycle, function-level ones included: a lazy
import hides a cycle from the interpreter but not from the reader, the modules still cannot be
understood, tested or moved apart, and the first call decides which half sees the other half-built.
Only imports under `if TYPE_CHECKING:` (they never run; annotations are strings under `from
__future__ import annotations`) and under `if __name__ == "__main__":` (the module run as a
program, which no import does) are exempt from this rule.

Inside search/ the subpackages are layered the same way, lowest first: search.base (the shared
vocabulary: trial attributes, states, tags, objectives, paths) <- search.tracking (MLflow) <-
search.analysis (reading finished studies, the ladder) <- search.study (running a study) <- the
commands, the modules at the top of search/ (run, confirm, export, sizing, audit, record). A search
module may import its own layer and those below it, function-level imports included; only imports
under `if TYPE_CHECKING:` (and `if __name__ == "__main__":`) are exempt, as for cycles: an
annotation may name a type of a layer above (the ladder's plan names the study's `Probe`).

`benchmarks/` and `tests/` sit above every layer and are not checked.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT

LAYERS = ("space", "trainer", "glue", "search", "dashboards")
# search/'s own layers, lowest first; "search" is its top level, the commands.
SEARCH_LAYERS = ("search.base", "search.tracking", "search.analysis", "search.study", "search")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module an `ImportFrom` names (relative imports resolved against `module`)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _is_main(test: ast.expr) -> bool:
    """`__name__ == "__main__"`: a block that runs only when the module is the program itself."""
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators))


def imports(path: Path, known: set[str]) -> list[tuple[str, int, bool]]:
    """(imported module, line, runs) for every import in `path`, `runs` False under `if
    TYPE_CHECKING:` and under `if __name__ == "__main__":` (a program's entry, which no import
    runs). `from a import b` names `a.b` when that is one of the `known` modules (a submodule), else `a`."""
    module = _module_name(path)
    is_package = path.name == "__init__.py"
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, runs: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno, runs) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(module, is_package, node)
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.append((sub if sub in known else target, node.lineno, runs))
        for child_field, value in ast.iter_fields(node):
            children = value if isinstance(value, list) else [value]
            for child in children:
                if not isinstance(child, ast.AST):
                    continue
                exempt = isinstance(node, ast.If) and child_field == "body" and (
                    _is_type_checking(node.test) or _is_main(node.test))
                visit(child, runs and not exempt)

    visit(ast.parse(path.read_text(), str(path)), True)
    return found


def _sources() -> dict[str, Path]:
    return {_module_name(path): path for layer in LAYERS for path in sorted((ROOT / layer).rglob("*.py"))}


def _package(module: str) -> str:
    return module.split(".", 1)[0]


def upward_imports(sources: dict[str, Path]) -> list[str]:
    """'importer:line imports module' for each import of a package above the importer's."""
    problems = []
    for module, path in sources.items():
        rank = LAYERS.index(_package(module))
        for target, line, _ in imports(path, set(sources)):
            top = _package(target)
            if top in LAYERS and LAYERS.index(top) > rank:
                problems.append(f"{module}:{line} imports {target} ({top} is above {_package(module)})")
    return problems


def _search_layer(module: str) -> str | None:
    """The layer of search/ that `module` belongs to (the longest matching prefix), None outside search/."""
    matching = [layer for layer in SEARCH_LAYERS if module == layer or module.startswith(f"{layer}.")]
    return max(matching, key=len, default=None)


def upward_search_imports(sources: dict[str, Path]) -> list[str]:
    """'importer:line imports module' for each import that runs, by a search module, of a search
    layer above the importer's (`if TYPE_CHECKING:` imports exempt)."""
    problems = []
    for module, path in sources.items():
        layer = _search_layer(module)
        if layer is None:
            continue
        for target, line, runs in imports(path, set(sources)):
            above = _search_layer(target)
            if runs and above is not None and SEARCH_LAYERS.index(above) > SEARCH_LAYERS.index(layer):
                problems.append(f"{module}:{line} imports {target} ({above} is above {layer})")
    return problems


def cycles(sources: dict[str, Path]) -> list[list[str]]:
    """The cycles (each once, as the modules on it) of the imports that run, inside one package."""
    graph = {module: sorted({target for target, _, runs in imports(path, set(sources))
                             if runs and target in sources and target != module
                             and _package(target) == _package(module)})
             for module, path in sources.items()}
    found: list[list[str]] = []
    seen: set[frozenset[str]] = set()

    def walk(node: str, trail: list[str]) -> None:
        for nxt in graph[node]:
            if nxt in trail:
                cycle = trail[trail.index(nxt):]
                if frozenset(cycle) not in seen:
                    seen.add(frozenset(cycle))
                    found.append(cycle)
            elif len(trail) < len(graph):
                walk(nxt, [*trail, nxt])

    for start in graph:
        walk(start, [start])
    return found


def test_no_module_imports_a_package_above_its_own():
    assert upward_imports(_sources()) == []


def test_search_layers_import_only_downwards():
    assert upward_search_imports(_sources()) == []


def test_no_import_cycle_inside_a_package():
    assert [" -> ".join([*cycle, cycle[0]]) for cycle in cycles(_sources())] == []


def _use_tree(root: Path, monkeypatch, files: dict[str, str]) -> None:
    """Write `files` (path -> text) under `root` and point the checks at it."""
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    monkeypatch.setattr(f"{__name__}.ROOT", root)


def test_the_checks_see_function_level_imports_and_cycles(tmp_path, monkeypatch):
    """The checks themselves, on a tiny tree: a lazy upward import, a two-module cycle and one
    closed by a function-level import are found; a TYPE_CHECKING import closes none."""
    _use_tree(tmp_path, monkeypatch, {
        "space/__init__.py": "",
        "space/a.py": "def f():\n    import trainer.x\n",
        "trainer/__init__.py": "",
        "trainer/x.py": "from trainer import y\n",
        "trainer/y.py": "from trainer.x import thing\n",
        "trainer/z.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trainer import w\n",
        "trainer/w.py": "from trainer import z\n",
        "trainer/v.py": "from trainer import w\ndef g():\n    from trainer import v2\n",
        "trainer/v2.py": "import trainer.v\n",
    })
    sources = _sources()
    assert upward_imports(sources) == ["space.a:2 imports trainer.x (trainer is above space)"]
    assert sorted(sorted(cycle) for cycle in cycles(sources)) == [["trainer.v", "trainer.v2"], ["trainer.x", "trainer.y"]]


def test_the_search_layer_check_sees_function_level_imports(tmp_path, monkeypatch):
    """The search layer check on a tiny tree: a command importing down and a TYPE_CHECKING import
    up pass; a function-level import up (base -> tracking) and an import of a command from the study
    layer are found."""
    _use_tree(tmp_path, monkeypatch, {
        "search/__init__.py": "",
        "search/run.py": "from search.study import driver\n",
        "search/base/__init__.py": "",
        "search/base/states.py": "",
        "search/base/attrs.py": "def f():\n    from search.tracking import tracker\n",
        "search/tracking/__init__.py": "",
        "search/tracking/tracker.py": ("from typing import TYPE_CHECKING\nfrom search.base import states\n"
                                       "if TYPE_CHECKING:\n    from search.study import driver\n"),
        "search/study/__init__.py": "",
        "search/study/driver.py": "from search.tracking.tracker import StudyTracker\ndef g():\n    import search.run\n",
    })
    assert upward_search_imports(_sources()) == [
        "search.base.attrs:2 imports search.tracking.tracker (search.tracking is above search.base)",
        "search.study.driver:3 imports search.run (search is above search.study)",
    ]
