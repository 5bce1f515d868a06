"""NVIDIA nccl-tests -J JSON: one document, read whole; its results become rows as the
stdout's do (nccl_tests), per-iteration objects giving the spread."""
from __future__ import annotations

import json
import math
import re

from commbench.core.stats import summarize_us

from ..provenance import ENV_PREFIXES
from .nccl_tests import _NCCL_DTYPES, NCCL_TIME_MEASURED, _nccl_params, _nccl_version
from .rows import benchmark_name, check_status, err, make_row, name_from_filename, quote, run_meta

# ---------------------------------------------------------------------------------------
# nccl-tests JSON (-J)

def _jval(v):
    """JSON scalars as nccl-tests writes them: numbers, "nan", "true"/"false" strings."""
    if isinstance(v, str):
        low = v.strip().lower()
        if low in ("true", "false"):
            return low == "true"
        try:
            return float(v)
        except ValueError:
            return v
    return v


def _jnum(v):
    v = _jval(v)
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    raise ValueError(v)


def _json_result_lines(text: str) -> list[int]:
    """Line of each element of the top-level results list (for error messages); the lines
    are counted on from the last element's, so a long list is read once."""
    m = re.search(r'"results"\s*:\s*\[', text)
    if not m:
        return []
    dec, pos, out = json.JSONDecoder(), m.end(), []
    line, counted = 1, 0
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return out
        line += text.count("\n", counted, pos)
        counted = pos
        out.append(line)
        try:
            _, pos = dec.raw_decode(text, pos)
        except (ValueError, RecursionError):
            return out


def _whole(v, what: str, bad, kind: str = "a count", null: bool = True):
    """A count or rank from the file (a whole number >= 0, written as a number or a
    string), or None when absent (null: None allowed); anything else is refused through
    bad(message)."""
    x = _jval(v)
    if x is None and null:
        return None
    if isinstance(x, float) and math.isfinite(x) and x == int(x):
        x = int(x)
    if isinstance(x, bool) or not isinstance(x, int) or x < 0:
        raise bad(f"{what} {quote(v)} is not {kind} (a whole number >= 0)")
    return x


def _of_type(doc: dict, key: str, kind, shape: str):
    """doc[key] when it is a `kind` (list or dict) or absent (None); else refused."""
    v = doc.get(key)
    if v is not None and not isinstance(v, kind):
        raise ValueError(f"{key}: {quote(v)} is not {shape}")
    return v


def _iter_stats(obj, where: str, bad) -> dict | None:
    """Per-iteration statistics (nccl-tests -I with -J) as time_us_* fields; a value that
    is not a number is refused through bad(message)."""
    if not isinstance(obj, dict):
        return None
    times = obj.get("times_us")
    if isinstance(times, list) and times:
        import numpy as np

        vals = []
        for i, x in enumerate(times):
            try:
                vals.append(_jnum(x))
            except ValueError:
                raise bad(f"{where}times_us[{i}] {quote(x)} is not a number (microseconds)") from None
        t = np.array([np.nan if x is None else x for x in vals], dtype=np.float64)
        t = t[np.isfinite(t)]
        if t.size:
            s = summarize_us(t * 1e-6)
            s.pop("time_us_p50")
            s.pop("time_us_mean")
            return s
    out = {}
    for k, key in (("time_us_min", "min_us"), ("time_us_max", "max_us"), ("time_us_p99", "p99_us"),
                   ("time_us_std", "stdev_us")):
        try:
            out[k] = _jnum(obj.get(key))
        except ValueError:
            raise bad(f"{where}{key} {quote(obj.get(key))} is not a number (microseconds)") from None
    out = {k: v for k, v in out.items() if v is not None and math.isfinite(v)}
    return out or None


def _load(path, text: str) -> dict:
    """The document, refused in one line when it is not JSON (or nested too deep for Python
    to read: a file of 100,000 nested lists) or holds no results list."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise err(path, e.lineno, f"not valid JSON ({e.msg}): truncated nccl-tests -J output?") from None
    except RecursionError:
        raise err(path, 1, "JSON nested too deep to read (thousands of levels): not nccl-tests -J output") from None
    except ValueError as e:  # a number of more digits than Python converts
        raise err(path, 1, f"not valid JSON ({str(e).split(';')[0]})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise err(path, 1, "not nccl-tests -J JSON (no top-level 'results' list)")
    return doc


def parse_nccl_json(path, text: str, world=None, benchmark=None, emit=None) -> dict:
    """nccl-tests -J: one JSON document, so it is read whole; each row goes to emit(row)."""
    doc = _load(path, text)
    version = doc.get("version")
    try:
        cfg = _of_type(doc, "config", dict, "an object (the run's settings)") or {}
        devices = _of_type(doc, "devices", list, "a list (an object per rank)") or []
        args = _of_type(doc, "args", list, "a list (the command line)") or []
        env_list = _of_type(doc, "env", list, "a list of NAME=VALUE strings") or []
        oob = _of_type(doc, "out_of_bounds", dict, "an object (with a count)") or {}
        avg_bw = _of_type(doc, "average_bus_bandwidth", dict, "an object (with a bandwidth)") or {}
    except ValueError as e:
        raise err(path, 1, str(e)) from None

    def bad_doc(msg):
        return err(path, 1, msg)

    ranks = []
    for k, d in enumerate(devices):
        if not isinstance(d, dict):
            raise bad_doc(f"devices[{k}] {quote(d)} is not an object (one per rank)")
        ranks.append(_whole(d.get("rank", k), f"devices[{k}].rank", bad_doc, "a rank number", null=False))
    hosts = [str(d.get("hostname")) for _, d in sorted(zip(ranks, devices), key=lambda rd: rd[0])]
    gpus = sorted({str(d.get("device_info")) for d in devices if d.get("device_info")})
    if devices:
        n = len(devices)
        if world is not None and int(world) != n:
            raise err(path, 1, f"the file lists {n} devices, --world says {world}")
    elif world is not None:
        n = int(world)
    else:
        raise err(path, 1, "nccl-tests JSON without a 'devices' list: pass --world N")
    args = [str(a) for a in args]
    res = doc["results"]
    lines = None
    name = benchmark
    if name is None and args:
        name = benchmark_name(args[0])
    if name is None:
        for r in res:
            if isinstance(r, dict) and r.get("experiment_name"):
                name = benchmark_name(str(r["experiment_name"]))
                break
    name = name or name_from_filename(path)
    if name is None:
        raise err(path, 1, "cannot tell the collective from args, experiment_name or the file name "
                            "(pass the benchmark name)")
    iters_cfg = _whole(cfg.get("iterations"), "config.iterations", bad_doc)
    agg = _whole(cfg.get("aggregated_iterations"), "config.aggregated_iterations", bad_doc)
    warmup = _whole(cfg.get("warmup_iters"), "config.warmup_iters", bad_doc)
    nrows = skipped = invalid = 0
    for k, r in enumerate(res):
        def bad(msg):
            nonlocal lines
            if lines is None:
                lines = _json_result_lines(text)
            return err(path, lines[k] if k < len(lines) else 1, f"results[{k}]: {msg}")

        if not isinstance(r, dict):
            raise bad("not an object")
        try:
            size = _jnum(r.get("size"))
            nbytes = int(size)
        except (TypeError, ValueError, OverflowError):
            raise bad(f"size {quote(r.get('size'))} is not a number") from None
        if nbytes != size:
            raise bad(f"size {quote(r.get('size'))} is not a whole number of bytes")
        if nbytes < 0:
            raise bad(f"size {nbytes} is negative")
        if nbytes == 0:
            skipped += 1
            continue
        typ = str(r.get("type", "float"))
        redop = r.get("redop")
        if redop is not None and not isinstance(redop, str):
            raise bad(f"redop {quote(redop)} is not a reduction's name (sum, prod, ...) or null")
        try:
            root = int(str(r.get("root", "-1")).strip())
        except ValueError:
            raise bad(f"root {quote(r.get('root'))} is not an integer") from None
        params = _nccl_params(redop, root)
        iters = _whole(r.get("actual_iterations"), "actual_iterations", bad) or ((iters_cfg or 0) * (agg or 1)) or None
        found = False
        for key in ("out_of_place", "in_place"):
            half = r.get(key)
            if half is None:
                continue
            if not isinstance(half, dict):
                raise bad(f"{key} is neither an object nor null")
            found = True
            try:
                cpu = "cpu_time" in half
                t = _jnum(half.get("cpu_time" if cpu else "time"))
                algbw, busbw = _jnum(half.get("alg_bw")), _jnum(half.get("bus_bw"))
                nwrong = _jnum(half.get("nwrong"))
            except ValueError as e:
                raise bad(f"{key}: {quote(e.args[0])} is not a number") from None
            if t is None or not math.isfinite(t) or t <= 0:
                invalid += 1  # said in the notes, never silent
                continue
            st = (_iter_stats(r.get(f"{key}_per_iter"), f"{key}_per_iter.", bad)
                  or _iter_stats(half.get("per_iter"), f"{key}.per_iter.", bad) or _iter_stats(half, f"{key}.", bad))
            if st is None and key == "out_of_place" and r.get("in_place") is None:
                st = _iter_stats(r, "", bad)
            spread = "std" if st and "time_us_std" in st else "none"
            note = ("per-iteration statistics give min/p90/p99/max/std" if st else
                    "only the mean: no per-iteration statistics in the file")
            nrows += 1
            emit(make_row(
                bench=name, backend="nccl", device="cuda", world=n, nbytes=nbytes,
                dtype=_NCCL_DTYPES.get(typ, typ), in_place=key == "in_place", params=params, iters=iters,
                warmup=warmup, clock="cpu_time" if cpu else "host_clock_loop_mean", mean_us=t,
                stats=st, algbw=algbw if algbw is not None and math.isfinite(algbw) else None,
                busbw=busbw if busbw is not None and math.isfinite(busbw) else None, check=check_status(nwrong),
                source=f"nccl-tests JSON ({note})", time_measured=NCCL_TIME_MEASURED, spread=spread,
                extra={"tool_nbytes": nbytes, "redop": redop, "root": root}))
        if not found:
            raise bad("neither out_of_place nor in_place holds a result")
    versions = {}
    if _nccl_version(doc.get("nccl_version")):
        versions["nccl"] = _nccl_version(doc.get("nccl_version"))
    env = {}
    for e in env_list:
        if isinstance(e, str) and "=" in e:
            k, v = e.split("=", 1)
            if k.startswith(ENV_PREFIXES):
                env[k] = v
    settings = {k: _jval(v) for k, v in cfg.items()}
    meta = run_meta("nccl-tests-json", path, nrows, hosts, gpus, n, "nccl", "cuda", versions, env,
                 notes=([f"{skipped} size-0 result(s) skipped"] if skipped else [])
                 + ([f"{invalid} result(s) without a valid time (zero, negative or NaN) left out"] if invalid else []),
                 extra={"tool": {"name": "nccl-tests", "json_version": version}, "tool_settings": settings,
                        "command": args or None, "started": doc.get("start_time"), "finished": doc.get("end_time"),
                        "out_of_bounds": oob.get("count"),
                        "tool_avg_busbw_gbps": [_jval(avg_bw.get("bandwidth"))]})
    return meta

