"""Cells: a number, a size or a missing value as the report's tables and findings write
it, and DataFrame rows as plain dicts for the code that writes them."""
from __future__ import annotations

import math

from commbench.core.units import fmt_size


def text(v) -> str:
    """A cell's text: "" for a missing value (None, NaN)."""
    if type(v) is str:  # most cells: no conversion (a report may hold millions of them)
        return v
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def fmt(v, digits: int = 2) -> str:
    """A number with `digits` decimals; "-" for a missing or non-finite one."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return "-"
    return f"{x:.{digits}f}" if math.isfinite(x) else "-"


def size_cells(values) -> list[str]:
    """A column of sizes (bytes) in one format: binary suffixes ("8", "1K", "4M") when every
    size of 1K or more is a whole number of its unit, else every size in plain bytes (never
    "7154K" beside "15708000")."""
    vals = [int(v) for v in values]
    if all(v < 1024 or v % 1024 == 0 for v in vals):
        return [fmt_size(v) for v in vals]
    return [str(v) for v in vals]


def num(v, sig: int = 4, most: int = 3) -> str:
    """One number format for a column whose values span decades: fixed point, `sig`
    significant digits but never more than `most` decimals, never an exponent ("11440",
    "2994", "29.94", "0.124"); "-" for a missing or non-finite value."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return "-"
    if not math.isfinite(x):
        return "-"
    if x == 0:
        return "0"
    return f"{x:.{min(most, max(0, sig - 1 - math.floor(math.log10(abs(x)))))}f}"


def is_number(v) -> bool:
    """A value that is not None or NaN."""
    return v is not None and v == v


def fixed(v, digits: int) -> str:
    """A number with `digits` decimals, or '-' where there is none."""
    return f"{v:.{digits}f}" if is_number(v) else "-"


def records(df) -> list[dict]:
    """df.to_dict("records"), column by column: each column's values come out as Python's
    own (Series.tolist), not boxed one value at a time (seconds for 300k rows)."""
    names = list(df.columns)
    cols = [df[c].tolist() for c in names]
    return [dict(zip(names, vals)) for vals in zip(*cols)]
