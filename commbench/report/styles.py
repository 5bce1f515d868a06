"""The same rows in the layout other tools print (`run --style`, `report --style`):
nccl-tests' one line per size with out-of-place and in-place side by side and its "Avg bus
bandwidth" footer; OSU's size, avg, min, max and iterations. Pure functions from rows to
lines of text: nothing is measured or recomputed here, only laid out."""
from __future__ import annotations

import math

from commbench.core.schema import has, params_dict
from commbench.report.fmt import text

STYLES = ("table", "nccl-tests", "osu")

# commbench dtype -> the name nccl-tests prints in its type column.
NCCL_TYPES = {"float32": "float", "float16": "half", "bfloat16": "bfloat16", "int32": "int32", "float64": "double",
              "uint8": "uint8", "int8": "int8", "int64": "int64"}
# nccl-tests' count column: elements per rank's block for these (size / type / ranks), the
# whole buffer's elements for the others.
_COUNT_PER_RANK = {"all_gather", "reduce_scatter", "all_to_all"}
_REDUCING = {"all_reduce", "reduce_scatter", "reduce"}
_ROOTED = {"broadcast", "reduce"}
_ELEM_NBYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "float64": 8, "uint8": 1, "int8": 1,
                "int64": 8}

# nccl-tests' table header (v2.19), its three comment lines, as it prints them.
NCCL_HEADER = (
    "#                                                              out-of-place                       in-place          ",
    "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)",
)
PLACES = ("out-of-place", "in-place")


def fit(v, width: int, digits: int = 2) -> str:
    """A number right-aligned in `width` characters, losing decimals before it would
    widen the column (nccl-tests' "11020.0"), then in exponent form ("1.2e+04")."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        return "N/A".rjust(width)
    if not math.isfinite(x):
        return "N/A".rjust(width)
    for d in range(digits, -1, -1):
        s = f"{x:.{d}f}"
        if len(s) <= width:
            return s.rjust(width)
    return f"{x:.1e}".rjust(width)


def _wrong(r) -> str:
    """#wrong: 0 for a point whose check passed; commbench checks pass or fail, so a failed
    point says "fail" (it has no count of wrong elements); N/A where nothing was checked."""
    c = text(r.get("check"))
    return {"ok": "0", "fail": "fail"}.get(c, "N/A")


def _groups(rows, keys):
    out: dict = {}
    for r in rows:
        out.setdefault(tuple(text(r.get(k)) if k != "params" else _params_text(r.get(k)) for k in keys),
                       []).append(r)
    return out


def _params_text(p) -> str:
    d = params_dict(p)
    return " ".join(f"{k}={v}" for k, v in sorted(d.items()))


# A block of either style: the rows of one run, benchmark, backend, world, dtype, variant,
# params and stage (nccl-tests prints one such table a process).
BLOCK_KEYS = ("run", "benchmark", "backend", "device", "world", "dtype", "variant", "params", "stage")


def _block_title(k: dict) -> str:
    extra = " ".join(x for x in (k["variant"] if k["variant"] not in ("", "default") else "", k["params"],
                                 k["stage"]) if x)
    return (f"# commbench {k['benchmark']} [{k['backend']}/{k['device']}] {k['world']} ranks {k['dtype']}"
            + (f" {extra}" if extra else "") + (f" (run {k['run']})" if k["run"] else ""))


def _time_is(rs) -> str:
    if any(has(r.get("source")) for r in rs):
        return "the imported tool's own time (nccl-tests: the mean over iterations)"
    return "p50 of the slowest rank per iteration (us)"


def nccl_tests_lines(rows) -> list[str]:
    """Sized collective rows as nccl-tests prints them: per block its header, one line per
    size with out-of-place and in-place side by side (time, algbw, busbw, #wrong each; N/A
    for a placement not measured), then "# Out of bounds values" and "# Avg bus bandwidth"
    (the mean busbw over every cell shown, both placements, as nccl-tests averages). time
    is the row's p50 of the slowest rank per iteration (an imported row's: the tool's own
    time)."""
    out = []
    for key, rs in _groups(rows, BLOCK_KEYS).items():
        k = dict(zip(BLOCK_KEYS, key))
        bench = k["benchmark"]
        out += [_block_title(k), f"# time = {_time_is(rs)}; GB = 1e9 B", "#", *NCCL_HEADER]
        bws, wrong = [], 0
        by_size: dict = {}
        for r in rs:
            by_size.setdefault(int(r["nbytes"]), {})[text(r.get("placement")) or "out-of-place"] = r
        for nbytes in sorted(by_size):
            at = by_size[nbytes]
            any_r = next(iter(at.values()))
            dtype = text(any_r.get("dtype"))
            elem = _ELEM_NBYTES.get(dtype, 1)
            world = int(any_r["world"]) or 1
            count = nbytes // elem // (world if bench in _COUNT_PER_RANK else 1)
            line = (f"{nbytes:12d}  {count:12d}  {NCCL_TYPES.get(dtype, dtype):>8s}  "
                    f"{'sum' if bench in _REDUCING else 'none':>6s}  {0 if bench in _ROOTED else -1:6d}")
            for place in PLACES:
                r = at.get(place)
                if r is None:
                    line += f"  {'N/A':>7s}  {'N/A':>6s}  {'N/A':>6s}  {'N/A':>6s}"
                    continue
                line += (f"  {fit(r['time_us_p50'], 7)}  {fit(r.get('algbw_gbps'), 6)}  {fit(r.get('busbw_gbps'), 6)}"
                         f"  {_wrong(r):>6s}")
                if has(r.get("busbw_gbps")):
                    bws.append(float(r["busbw_gbps"]))
                wrong += text(r.get("check")) == "fail"
            out.append(line)
        out.append(f"# Out of bounds values : {wrong} {'FAILED' if wrong else 'OK'}")
        out.append(f"# Avg bus bandwidth    : {sum(bws) / len(bws):g} " if bws else "# Avg bus bandwidth    : N/A ")
        out.append("#")
    return out


# OSU's `-f` header and column widths.
OSU_HEADER = "# Size       Avg Latency(us)   Min Latency(us)   Max Latency(us)  Iterations"


def osu_lines(rows) -> list[str]:
    """Rows as OSU's latency tests print them with -f: size, avg, min and max latency
    (us), iterations; one block per placement too. avg is the row's mean of the slowest
    rank per iteration, min and max that distribution's extremes (OSU averages each rank's
    mean over the ranks: a slower rank weighs less there); a statistic the row lacks (an
    imported file without -f) is N/A."""
    out = []
    keys = BLOCK_KEYS + ("placement",)
    for key, rs in _groups(rows, keys).items():
        k = dict(zip(keys, key))
        out.append(_block_title(k) + (f" {k['placement']}" if k["placement"] else ""))
        imported = any(has(r.get("osu_min_us")) for r in rs)
        out.append("# avg, min, max: OSU's own (min/max over ranks of each rank's average)" if imported else
                   "# avg = mean, min/max = extremes of the slowest rank per iteration")
        out.append(OSU_HEADER)
        for r in sorted(rs, key=lambda r: int(r["nbytes"])):
            iters = r.get("iters")
            it = str(int(float(iters))) if has(iters) else "N/A"
            # An imported OSU row keeps OSU's min and max apart from the per-iteration ones.
            lo = r.get("osu_min_us") if has(r.get("osu_min_us")) else r.get("time_us_min")
            hi = r.get("osu_max_us") if has(r.get("osu_max_us")) else r.get("time_us_max")
            out.append(f"{int(r['nbytes']):<10d}{fit(r.get('time_us_mean'), 16)}{fit(lo, 18)}{fit(hi, 18)}{it:>12s}")
    return out
