"""The HTML of the study report: its style sheet, number formats, tables and figures."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from search.analysis.stats import plus_minus
from search.tracking.params import params_under
from space.arch import ArchConfig, ArchError

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 0;
       background: #f6f8fa; color: #1f2328; line-height: 1.45; }
main { max-width: 1320px; margin: 0 auto; padding: 24px 32px 64px; }
h1 { font-size: 28px; margin: 8px 0 4px; }
h2 { font-size: 20px; margin: 0 0 4px; }
section { background: #fff; border: 1px solid #d0d7de; border-radius: 8px; padding: 16px 24px; margin: 18px 0; }
p.lead { color: #57606a; margin: 0 0 12px; }
.facts { display: flex; flex-wrap: wrap; gap: 8px 28px; margin: 8px 0 0; color: #424a53; }
.facts b { color: #1f2328; }
nav { margin: 12px 0 0; font-size: 14px; }
nav a { margin-right: 14px; }
a { color: #0969da; text-decoration: none; }
a:hover { text-decoration: underline; }
table { border-collapse: collapse; font-size: 14px; margin: 6px 0 10px; }
th { text-align: left; font-weight: 600; background: #f6f8fa; border-bottom: 1px solid #d0d7de; }
th, td { padding: 4px 12px 4px 8px; border-bottom: 1px solid #eaeef2; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
/* A table wider than its card scrolls inside it rather than spilling out; an interval may break
   before its brackets. */
.table-wrap { overflow-x: auto; max-width: 100%; }
td.ci { text-align: right; font-variant-numeric: tabular-nums; white-space: normal; min-width: 9em; }
td.reason { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12px; max-width: 760px;
            word-break: break-word; }
tr.group td { background: #f6f8fa; font-weight: 600; }
.best { color: #1a7f37; font-weight: 600; }
.apart { color: #9a6700; }
.muted { color: #6e7781; }
.greyed { opacity: 0.45; filter: grayscale(1); }
.note { background: #fff8c5; border: 1px solid #eac54f; border-radius: 6px; padding: 6px 10px; margin: 8px 0; }
"""


# ---- formatting ---------------------------------------------------------------------------------

def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x)) or x is pd.NA


def num(x, digits: int = 4) -> str:
    """4 significant digits; thousands separated; a dash for missing."""
    if _missing(x):
        return "–"
    x = float(x)
    return f"{x:,.0f}" if abs(x) >= 10 ** digits else f"{x:.{digits}g}"


def human(x) -> str:
    """1234567 -> 1.23M: token and parameter counts."""
    if _missing(x):
        return "–"
    for size, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= size:
            return f"{x / size:.3g}{unit}"
    return f"{x:.3g}"


def plural(n: int, noun: str) -> str:
    """`1 complete trial`, `3 complete trials` (the noun's last word takes the -s)."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def interval(mean, low, high, *, signed: bool = False) -> str:
    """A mean and its 95% interval (a frame's `low` and `high`) as search.confirm's table writes
    them (`search.analysis.stats.plus_minus`): `4.253 ± 0.234`; without bounds, `4.253 (n=1)`."""
    if _missing(mean):
        return "–"
    if _missing(low):
        return f"{plus_minus(float(mean), None, signed=signed)} (n=1)"
    return plus_minus(float(mean), (float(high) - float(low)) / 2, signed=signed)


def architecture(row) -> str:
    """A run's architecture in a few words (`ArchConfig.describe`), from its `params.arch.*`."""
    arch = params_under(row, "arch")
    try:
        return ArchConfig.from_dict(arch).describe() if arch else "?"
    except ArchError as error:  # an impossible architecture (its trial failed), or a field this version lacks
        return f"invalid: {error}"


def esc(text) -> str:
    return "–" if _missing(text) else html.escape(str(text))


def link(url: str, text) -> str:
    return f'<a href="{html.escape(url, quote=True)}">{esc(text)}</a>'


def _class(name: str | None) -> str:
    return f' class="{name}"' if name else ""


def table(headers: Sequence[str], rows: Sequence[Sequence[str] | str], numeric: Sequence[int] = (),
          classes: dict[int, str] | None = None) -> str:
    """An HTML table. Cells are HTML already (escape text with `esc`); a row given as a string is
    used as is (a group heading); columns in `numeric` align right, `classes` styles others."""
    styles = {**(classes or {}), **dict.fromkeys(numeric, "num")}

    def cells(values, tag):
        return "".join(f'<{tag}{_class(styles.get(i))}>{v}</{tag}>' for i, v in enumerate(values))
    body = "".join(f"<tr>{cells(row, 'td')}</tr>" if not isinstance(row, str) else row for row in rows)
    return (f'<div class="table-wrap"><table><thead><tr>{cells(headers, "th")}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


# The figures' colours: every trial, a front or highlighted trial, the best so far, a lineage edge.
COLOURS = {"point": "#8c959f", "front": "#0969da", "best": "#1a7f37", "edge": "#afb8c1"}


def figure_html(fig: go.Figure, height: int = 420) -> str:
    fig.update_layout(height=height, template="plotly_white", margin={"l": 60, "r": 30, "t": 50, "b": 50},
                      font={"size": 13}, legend={"orientation": "h", "y": -0.18})
    # plotly.js is in the page head once; every figure reuses it.
    return fig.to_html(full_html=False, include_plotlyjs=False, config={"displaylogo": False, "responsive": True})


def readable_range(values: pd.Series) -> dict:
    """Axis settings for `values` whose span is next to nothing (one point, or all alike): plotly
    would stretch it over the axis and tick it 19.587k, 19.5875k, 19.588k. Such an axis spans 5%
    either side of the values instead (1 either side of 0), so its ticks are round numbers."""
    finite = values.astype(float)[values.astype(float).map(math.isfinite)]
    if finite.empty:
        return {}
    low, high = float(finite.min()), float(finite.max())
    centre = (low + high) / 2
    pad = abs(centre) * 0.05 or 1.0
    if high - low >= pad / 5:  # a spread of at least 1% of the value: plotly's own range reads well
        return {}
    return {"range": [centre - pad, centre + pad]}
