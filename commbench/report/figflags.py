"""How a figure draws the rows that are not evidence for a verdict (analyse.verdicts
.untrusted_reason: a row that carries a warning, ran disturbed or oversubscribed): hollow
markers of the series' colour, apart from the line through the rows that are evidence, and
one legend entry that says what hollow means and how many rows it marks. A peak that rests
on a flagged row then reads as what it is, not as a result.
"""
from __future__ import annotations

import numpy as np

from commbench.analyse.verdicts import untrusted_reason

# untrusted_reason's words (before any "(...)") -> how the legend counts them.
_WHY = {"oversubscribed": "oversubscribed", "disturbed while it ran": "disturbed", "carries a warning": "with a warning"}
CAPTION = "; hollow markers: rows that are not evidence (a warning, disturbed or oversubscribed), not joined by the line"


def with_flags(d):
    """d with `_flag` (the row is not evidence) and `_why` (untrusted_reason's words)."""
    why = [untrusted_reason(r).split(" (")[0] for r in d.to_dict("records")] if len(d) else []
    return d.assign(_flag=[bool(w) for w in why], _why=why)


def flags(rows) -> np.ndarray:
    """One bool a row: not evidence (with_flags' column where the rows have it)."""
    if "_flag" in rows.columns:
        return rows["_flag"].fillna(False).to_numpy(dtype=bool)
    return with_flags(rows)["_flag"].to_numpy(dtype=bool)


def row_flagged(row: dict) -> bool:
    """One row (a dict): not evidence."""
    return bool(row["_flag"]) if "_flag" in row else bool(untrusted_reason(row))


def plot_flagged(ax, x, y, flagged, **kw):
    """One series: its line and filled markers through the points that are evidence, hollow
    markers of the same colour (not joined) at the flagged ones. kw: ax.plot's (label,
    marker, colour ...). Returns the line, which carries the series' label."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    f = np.asarray(flagged, dtype=bool)
    (line,) = ax.plot(x[~f], y[~f], **kw)
    if f.any():
        ax.plot(x[f], y[f], ls="none", marker=kw.get("marker") or "o", ms=kw.get("ms", 3) + 1.5, mfc="none",
                mec=line.get_color(), mew=1.0, label="_flagged")
    return line


def flag_entry(rows) -> list:
    """[(handle, label)] of the legend entry for the flagged rows among `rows` ("hollow: not
    evidence: 12 disturbed, 2 with a warning"); [] when none is flagged."""
    from matplotlib.lines import Line2D

    d = rows if "_why" in rows.columns else with_flags(rows)
    counts: dict = {}
    for w in d["_why"]:
        if w:
            k = _WHY.get(w, w)
            counts[k] = counts.get(k, 0) + 1
    if not counts:
        return []
    said = ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    handle = Line2D([], [], ls="none", marker="o", ms=5, mfc="none", mec="0.3", mew=1.0)
    return [(handle, f"hollow: not evidence ({said})")]


def flag_caption(rows) -> str:
    """CAPTION when any of the rows is flagged, else ""."""
    return CAPTION if flags(rows).any() else ""
