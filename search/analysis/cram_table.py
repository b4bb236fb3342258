"""The rows of a real-cram table (benchmarks/cram_table.py's CSV: architectures crammed at one
budget, some with several seeds) that have a loss: what the surrogate is fitted to and what
`search.transfer --table` takes its candidates from; and the table's columns and the store of
crams (`search.analysis.crams.CramStore`) that it is, which benchmarks/cram_table.py appends to."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from search.analysis.crams import CramStore
from space.arch import FIELD_TYPES, ArchConfig


@dataclass(frozen=True)
class TableCram:
    """One row of the table that has a loss."""

    architecture: str  # the architecture's fingerprint, computed from its fields today
    source: str
    seed: int
    config: ArchConfig
    loss: float


def _parse(text: str, kind: str) -> Any:
    # csv.DictWriter wrote Python's str(): True/False, 1e-05, 0.02.
    if kind == "bool":
        if text not in ("True", "False"):
            raise ValueError(f"expected True or False, got {text!r}")
        return text == "True"
    return {"int": int, "float": float, "str": str}[kind](text)


def read_crams(path: str | Path) -> tuple[list[TableCram], int]:
    """The rows of `path` with a loss, and how many rows were skipped (failed crams, no loss)."""
    crams, skipped = [], 0
    with Path(path).open(newline="") as file:
        for row in csv.DictReader(file):
            loss = row.get("validation_loss") or ""
            if (row.get("error") or "").strip() or not loss.strip() or not math.isfinite(float(loss)):
                skipped += 1
                continue
            config = row_arch(row)
            # Today's fingerprint, not the stored key's: two spellings of one network are one architecture.
            crams.append(TableCram(config.fingerprint(), row["source"], int(row["seed"]), config, float(loss)))
    return crams, skipped


# ---- the table's file (benchmarks/cram_table.py appends to it) ----------------------------------

RESULT_COLUMNS = ("validation_loss", "regime", "nats_below_floor", "corruption_floor", "context_reference",
                  "tokens", "params", "seconds")
COLUMNS = ("key", "source", "seed", "budget", *FIELD_TYPES, *RESULT_COLUMNS, "error")


def row_arch(row: dict) -> ArchConfig:
    """The architecture of a row from its field columns; a field the table has no column for (one
    added to ArchConfig after the table was written) takes its default."""
    return ArchConfig.from_dict({name: _parse(str(row[name]), kind) for name, kind in FIELD_TYPES.items()
                                 if row.get(name) not in (None, "")})


def row_id(row: dict) -> tuple[str, str, str]:
    """What identifies a cram of the table: where it came from, its seed and budget. Not its `key`,
    whose fingerprint part a change of `ArchConfig.canonical` may respell (27 one-layer rows did):
    a resume would cram those again."""
    return row["source"], str(row["seed"]), row.get("budget") or row["key"].rsplit("|", 1)[1]


def table_store(path: Path) -> CramStore:
    """The table as a store of crams: a CSV row each, found again by `row_id`, and a kept row under
    a planned row's id must be that row's architecture (by today's fingerprint of its fields)."""
    return CramStore(path, row_id, COLUMNS, lambda row: row_arch(row).fingerprint())
