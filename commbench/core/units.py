"""Sizes and dtypes: parsing and formatting, one source of truth."""
from __future__ import annotations

import re

from .errors import UsageError

# Element sizes of the dtypes a sweep may name; backends declare which they carry.
DTYPE_NBYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4, "float64": 8, "uint8": 1}
SWEEP_DTYPES = ("float32", "bfloat16", "float16", "int32")

# The largest count a C int holds: an MPI call takes no more elements without MPI-4
# large-count calls.
INT_MAX = 2**31 - 1

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text) -> int:
    """'8', '4K', '4M', '1G', '64KiB' -> bytes (binary suffixes, as nccl-tests reads -b/-e)."""
    if isinstance(text, bool):
        raise UsageError(f"size {text!r} is not a size")
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE_RE.match(str(text))
        if not m:
            raise UsageError(f"size {text!r} is not a size (use e.g. 8, 64K, 4M, 1G)")
        value = int(m.group(1)) * _SUFFIX[m.group(2).upper()]
    if value <= 0:
        raise UsageError(f"size {text!r} must be positive")
    return value


def size_range(min_nbytes: int, max_nbytes: int, factor: int) -> list[int]:
    """Geometric sweep min, min*f, ... <= max (nccl-tests -b/-e/-f)."""
    if min_nbytes > max_nbytes:
        raise UsageError(f"size range is inverted: min {fmt_size(min_nbytes)} > max {fmt_size(max_nbytes)}")
    if not isinstance(factor, int) or isinstance(factor, bool) or factor < 2:
        raise UsageError(f"size factor must be an integer >= 2, got {factor!r}")
    out, s = [], min_nbytes
    while s <= max_nbytes:
        out.append(s)
        s *= factor
    return out


def parse_sizes_arg(text: str) -> dict | list:
    """CLI form: 'MIN:MAX[:FACTOR]' (a range) or 'A,B,C' (a list)."""
    if not text.replace(",", "").strip():
        raise UsageError("--sizes is empty: give MIN:MAX[:FACTOR] or A,B,C")
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise UsageError(f"--sizes {text!r}: use MIN:MAX[:FACTOR] or A,B,C")
        try:
            factor = int(parts[2]) if len(parts) == 3 else 2
        except ValueError:
            raise UsageError(f"--sizes {text!r}: factor must be an integer") from None
        return {"min": parts[0], "max": parts[1], "factor": factor}
    return [p for p in text.split(",") if p.strip()]


def sweep_sizes(value: dict | list) -> tuple[list[int], bool]:
    """The sizes in bytes that a range {min, max, factor} or a list names (parse_sizes_arg's
    forms, a suite's `sizes`), and whether they came from a range: a sweep rounds a ranged
    size down to what a point can split, where a size named in a list is refused instead."""
    if isinstance(value, dict):
        return size_range(parse_size(value["min"]), parse_size(value["max"]), value.get("factor", 2)), True
    return sorted({parse_size(s) for s in value}), False


def fmt_size(nbytes: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}"


def check_dtype(name: str) -> str:
    if name not in SWEEP_DTYPES:
        raise UsageError(f"unknown dtype {name!r} (known: {', '.join(SWEEP_DTYPES)})")
    return name
