"""Writing files so that a killed process or a full disk never leaves a half-written one where a
reader looks: readers see what was there before or the whole new thing.

`write_atomically` replaces one text file. `atomic_directory` writes the files of a directory
under temporary names, forces each to disk as it is written (a full disk may only show when data
reaches it), and publishes them only once all are written. Its three users differ in what they
publish into, so each names its rule (`if_exists`):

    "replace"  a new directory renamed into place over any old one: the resumable checkpoints
               (trainer/resume.py), where a second checkpoint of the same step replaces the first
    "keep"     a new directory renamed into place unless one is there already: the data cache's
               entries (trainer/data.py), where another process may have prepared the same entry
    "merge"    the files renamed one by one, in the order written, into an existing directory: the
               final checkpoint (trainer/checkpoint.py), whose directory is the user's --out and
               also holds the resumable checkpoints

A block that raises leaves nothing under a final name: its temporary files are removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal, TypeVar

T = TypeVar("T")


def write_atomically(path: Path, text: str) -> None:
    """Write under a temporary name and rename: readers see the old file or the whole new one."""
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    partial.write_text(text)
    partial.replace(path)


def fsync_path(path: Path) -> None:
    """Force a file, or a directory's entries (the names renamed into it), to disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class Staged:
    """The files of an `atomic_directory` block, each written under a temporary name."""

    def __init__(self, final: Path, merge: bool):
        self.final, self.merge = final, merge
        tag = uuid.uuid4().hex[:8]  # unique across processes, also on a cache shared between machines
        # Merged files are written beside their final names (`.model.safetensors.tmp-<tag>`), which
        # fault injection recognises (search/study/trial.py's `diskfull`); a new directory is built whole.
        self.tag, self.dir = tag, final if merge else final.parent / f".{final.name}.tmp-{tag}"
        self.written: list[str] = []  # in order: "merge" publishes them in it

    def path(self, name: str) -> Path:
        """Where the file `name` is written before it is published."""
        return self.dir / (f".{name}.tmp-{self.tag}" if self.merge else name)

    def write(self, name: str, write: Callable[[Path], T]) -> T:
        """`write(path)` for the file `name`, then forced to disk; returns what `write` returned."""
        path = self.path(name)
        self.written.append(name)  # first: a write that fails half-way leaves a file to remove
        result = write(path)
        fsync_path(path)
        return result

    def discard(self) -> None:
        if self.merge:
            for name in self.written:
                self.path(name).unlink(missing_ok=True)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def publish(self, if_exists: str) -> None:
        if self.merge:
            for name in self.written:
                os.replace(self.path(name), self.final / name)
            fsync_path(self.final)
            return
        fsync_path(self.dir)
        if if_exists == "keep":
            try:
                self.dir.rename(self.final)
            except OSError:  # another process published the same entry meanwhile: theirs is as good
                if not self.final.exists():
                    raise
                shutil.rmtree(self.dir)
        else:
            replaced = self.final.parent / f".{self.final.name}.old-{self.tag}"
            if self.final.exists():
                self.final.rename(replaced)
            self.dir.rename(self.final)
            shutil.rmtree(replaced, ignore_errors=True)
        fsync_path(self.final.parent)


@contextlib.contextmanager
def atomic_directory(final: Path, if_exists: Literal["replace", "keep", "merge"]) -> Iterator[Staged]:
    """Write the files of `final` with `Staged.write` in the block; they are published when it ends
    (by the rule `if_exists`, see the module docstring) and removed when it raises."""
    staged = Staged(final, merge=if_exists == "merge")
    staged.dir.mkdir(parents=True, exist_ok=staged.merge)
    try:
        yield staged
        staged.publish(if_exists)
    except BaseException:
        staged.discard()
        raise
