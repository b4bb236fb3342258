"""trainer/atomic.py: a directory is published whole or not at all, by each of its three rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.atomic import atomic_directory


def contents(directory: Path) -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(directory.iterdir())}


def write(final: Path, rule: str, files: dict[str, str], fail_at: str | None = None) -> None:
    with atomic_directory(final, if_exists=rule) as staged:
        for name, text in files.items():
            if name == fail_at:
                raise OSError("disk full")
            staged.write(name, lambda path, text=text: path.write_text(text))


@pytest.mark.parametrize("rule", ["replace", "keep", "merge"])
def test_a_failed_write_leaves_what_was_there(rule, tmp_path):
    final = tmp_path / "entry"
    write(final, rule, {"a": "1", "b": "1"})
    with pytest.raises(OSError, match="disk full"):
        write(final, rule, {"a": "2", "b": "2"}, fail_at="b")
    assert contents(final) == {"a": "1", "b": "1"}
    assert sorted(path.name for path in tmp_path.iterdir()) == ["entry"]  # no temporary left beside it


def test_each_rule_publishes_as_it_says(tmp_path):
    for rule, expected in {"replace": {"b": "2"}, "keep": {"a": "1"}, "merge": {"a": "1", "b": "2"}}.items():
        final = tmp_path / rule
        write(final, rule, {"a": "1"})
        write(final, rule, {"b": "2"})
        assert contents(final) == expected, rule
    assert sorted(path.name for path in tmp_path.iterdir()) == ["keep", "merge", "replace"]
