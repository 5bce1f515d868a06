"""What a summary may rest a verdict on, and how it says so.

A verdict ("best", "scales", "hidden behind compute", "faster") is only as good as the rows
under it. A row that carries a warning (a disturbed point, a missed calibration), or that ran
with more ranks than cores, measures the host's scheduler as much as the collective: it is
shown, never chosen as best and never used as evidence. Each verdict line ends with what it
rests on (how many rows, one run or several) so a reader can weigh it (docs/verdicts.md).
"""
from __future__ import annotations

from commbench.core.schema import has

CANNOT_JUDGE = "cannot judge"
NO_CHANGE = "no change expected"

# Open MPI coll/tuned's forcing variables: which collective each one changes.
_OMPI_COLL = {"allreduce": "all_reduce", "allgather": "all_gather", "reduce_scatter_block": "reduce_scatter",
              "reduce_scatter": "reduce_scatter", "alltoall": "all_to_all", "bcast": "broadcast",
              "barrier": "barrier", "reduce": "reduce"}
_OMPI_PREFIX, _OMPI_SUFFIX = "OMPI_MCA_coll_tuned_", "_algorithm"


def _truthy(v) -> bool:
    if isinstance(v, str):
        return v.strip().lower() in ("true", "1", "yes")
    return has(v) and bool(v)


def untrusted_reason(row) -> str:
    """Why a row cannot be evidence for a verdict ('' when it can)."""
    get = row.get if hasattr(row, "get") else (lambda k, d=None: getattr(row, k, d))
    if _truthy(get("oversubscribed")):
        rpc = get("ranks_per_core")
        return f"oversubscribed ({float(rpc):g} ranks per core)" if has(rpc) else "oversubscribed"
    if _truthy(get("disturbed")):
        return "disturbed while it ran"
    if has(get("warning")) and str(get("warning")).strip():
        return "carries a warning"
    return ""


def trusted_mask(df):
    """A boolean Series: the rows a verdict may rest on."""
    return df.apply(lambda r: untrusted_reason(r) == "", axis=1) if len(df) else df.index.to_series().astype(bool)


def excluded_note(df, mask) -> str:
    """'; 3 of 8 rows not used (2 oversubscribed, 1 carries a warning)' or ''."""
    bad = df[~mask]
    if not len(bad):
        return ""
    why: dict = {}
    for r in bad.to_dict("records"):
        k = untrusted_reason(r).split(" (")[0]
        why[k] = why.get(k, 0) + 1
    return f"; {len(bad)} of {len(df)} rows not used as evidence (" + ", ".join(f"{n} {k}" for k, n in why.items()) + ")"


def rests_on(df) -> str:
    """'rests on 6 rows of one run' / '... of 3 runs'."""
    runs = df["run"].nunique() if "run" in df.columns and len(df) else 1
    return f"rests on {len(df)} row(s) of {'one run' if runs <= 1 else f'{runs} runs'}"


def cannot_judge(df, what: str) -> str:
    """The verdict when no row may be used: say why, by the rows' own reasons."""
    reasons = sorted({untrusted_reason(r) for r in df.to_dict("records")} - {""})
    return f"{CANNOT_JUDGE} {what}: every row is {' or '.join(reasons) if reasons else 'unusable'}"


def changes_algorithm(variant_env: dict | None, benchmark: str) -> bool | None:
    """Does a variant's environment change this collective's algorithm? False when it forces
    Open MPI coll/tuned algorithms for other collectives only (ompi-ring on reduce_scatter:
    reduce_scatter_block has no ring, so it is left at the default); None when the variant
    says nothing this function can read (NCCL_ALGO applies to every collective NCCL runs it
    for: measured, not assumed)."""
    env = variant_env or {}
    forced = {_OMPI_COLL.get(k[len(_OMPI_PREFIX):-len(_OMPI_SUFFIX)]) for k in env
              if k.startswith(_OMPI_PREFIX) and k.endswith(_OMPI_SUFFIX)}
    if not forced:
        return None
    return benchmark in forced


def clearly_faster(base_row, row) -> bool:
    """One run each: the variant's p90 below the baseline's p50, so nine in ten of its
    iterations beat the baseline's median. The spread inside a run is all one run shows;
    how much a point moves between runs is not in it, and the verdict line says so."""
    try:
        return float(row["time_us_p90"]) < float(base_row["time_us_p50"])
    except (KeyError, TypeError, ValueError):
        return False


def median_row(rows: list):
    """Of one point's repeats, the row with the median p50 (the lower of the two middle ones)."""
    rs = sorted(rows, key=lambda r: float(r["time_us_p50"]))
    return rs[(len(rs) - 1) // 2]


def faster_at_size(base_rows: list, var_rows: list) -> bool | None:
    """Is the variant faster than the baseline at one size? Several repeats a side: the
    repeats paired in order (repeat k of each ran next to each other: the variants alternate
    repeat by repeat), True when the variant is clearly faster in every pair (clearly_faster:
    its p90 below the baseline's p50), False when it is clearly slower in every pair, None
    otherwise: the spread between repeats, or inside them, is larger than the effect. That a
    pair merely points the same way is not enough: two repeats of identical settings point
    the same way half the time. One run a side: clearly_faster. Rows that cannot be evidence
    are left out first."""
    b = [r for r in base_rows if not untrusted_reason(r)]
    v = [r for r in var_rows if not untrusted_reason(r)]
    if not b or not v:
        return None
    if len(b) > 1 and len(v) > 1:
        b = sorted(b, key=lambda r: int(r.get("repeat") or 1))
        v = sorted(v, key=lambda r: int(r.get("repeat") or 1))
        pairs = list(zip(b, v))
        if all(clearly_faster(x, y) for x, y in pairs):
            return True
        if all(clearly_faster(y, x) for x, y in pairs):
            return False
        return None
    return clearly_faster(median_row(b), median_row(v))
