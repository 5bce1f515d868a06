"""NVIDIA nccl-tests output: the stdout tables (read by their header text, so the -C
cputime, -S timestamp and -I per-iteration columns of newer versions are found wherever
they stand) and the -J JSON file.

Each size line holds an out-of-place and an in-place half: each becomes a row whose
`placement` says which, as commbench's own rows do. The time is the loop's mean; -I
columns or -J per-iteration objects give the spread."""
from __future__ import annotations

import math
import re

from .rows import (
    Notes,
    benchmark_name,
    busbw_factor,
    check_status,
    err,
    fnum,
    make_row,
    name_from_filename,
    numbered_lines,
    quote,
    run_meta,
)

# nccl-tests type names -> commbench dtype names.
_NCCL_DTYPES = {"float": "float32", "half": "float16", "double": "float64", "bfloat16": "bfloat16",
                "int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32", "int64": "int64",
                "uint64": "uint64", "f8e4m3": "fp8_e4m3", "f8e5m2": "fp8_e5m2"}

# Every pattern here is anchored, starts with a literal, or (the NCCL log's) starts only where
# a run of its characters starts, so a long line costs time in proportion to its length (an
# unanchored pattern that begins with a repeated class retries from every character: hours
# for a 1 MB line). The device name is taken to the line's end and stripped after, not by a
# lazy group before `\s*$`.
_RANK_RE = re.compile(r"^#?\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)\s+"
                      r"\[([^\]]*)\]\s*(.*)$")


def _nccl_version(code) -> str | None:
    try:
        c = int(code)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an infinite number
        return None
    if c <= 0:
        return None
    if c >= 10000:  # 2.9 and later: major*10000 + minor*100 + patch
        return f"{c // 10000}.{c % 10000 // 100}.{c % 100}"
    return f"{c // 1000}.{c % 1000 // 100}.{c % 100}"



def _nccl_params(redop, root) -> dict:
    """The point's params: a reduction other than sum, a root other than 0."""
    params = {}
    if redop not in (None, "sum", "none"):
        params["redop"] = redop
    if isinstance(root, int) and root > 0:
        params["root"] = root
    return params


# ---------------------------------------------------------------------------------------
# nccl-tests stdout

_LEAD = ("size", "count", "type", "redop", "root")
_HALF_NAMES = ("out-of-place", "in-place")


def _nccl_header(tokens: list[str], group_line: str | None, path, lineno: int) -> dict:
    cols = list(tokens)
    ts = bool(cols) and cols[-1] == "timestamp"
    if ts:
        cols = cols[:-1]
    starts = [i for i, c in enumerate(cols) if c in ("time", "cputime")]
    if not starts:
        raise err(path, lineno, "nccl-tests header has no time/cputime column")
    lead = cols[:starts[0]]
    if "size" not in lead:
        raise err(path, lineno, "nccl-tests header has no size column")
    halves = [cols[a:b] for a, b in zip(starts, starts[1:] + [len(cols)])]
    names = re.findall(r"out-of-place|in-place", group_line or "")
    if len(names) != len(halves):
        names = list(_HALF_NAMES[:len(halves)])
    for h in halves:
        if "algbw" not in h or "busbw" not in h:
            raise err(path, lineno, f"nccl-tests header half {quote(' '.join(h), 60)} lacks algbw/busbw")
    return {"lead": lead, "halves": list(zip(names, halves)), "timestamp": ts, "ncols": len(cols),
            "line": lineno, "cputime": "cputime" in cols, "per_iter": "i_min" in cols}


class _NcclBlock:
    def __init__(self, line: int):
        self.line = line
        self.name = None
        self.ranks: dict[int, tuple] = {}
        self.run_params: dict = {}
        self.header = None
        self.group_line = None
        self.footer = False
        self.out_of_bounds = None
        self.avg_busbw = None
        self.bench = None  # resolved when the table's header is read
        self.world = None
        self.skipped = self.invalid = self.rows = 0
        self.last_data = None
        self.ratio_checked = False


def _parse_nccl_params(body: str) -> dict:
    out = {}
    for key, pat in (("warmup", r"warmup iters:\s*(\d+)"), ("iters", r"(?<!warmup )(?<!agg )iters:\s*(\d+)"),
                     ("agg_iters", r"agg iters:\s*(\d+)"), ("validation", r"validation:\s*(\d+)"),
                     ("graph", r"graph:\s*(\d+)"), ("ngpus", r"nGpus\s+(\d+)"), ("nthreads", r"nThread\s+(\d+)")):
        m = re.search(pat, body)
        if m:
            out[key] = int(m.group(1))
    return out


# NCCL's own log lines ("host:pid:tid [dev] NCCL INFO ...", "host:pid:tid [0] misc/ibvwrap.cc:63
# NCCL WARN ..."), which NCCL_DEBUG prints to the same stdout: at a line's start, or inside a
# size line that nccl-tests printed in two parts (the rest of the row then follows the log
# line). The pattern starts only where a run of host-name characters starts (the lookbehind),
# so each run is read once; the host is that run from its first letter, so a row's last
# digit glued to it is not taken for it.
_NCCL_LOG_IN_RE = re.compile(r"(?<![\w.-])([\w.-]+):\d+:\d+ \[\d+\] (?:\S+ )?NCCL (?:INFO|WARN|ERROR|TRACE|ABORT)\b")
_LETTER_RE = re.compile(r"[A-Za-z]")


def nccl_log_start(s: str) -> int | None:
    """Where an NCCL log line starts in s (its host name's first letter), or None."""
    pos = 0
    while True:
        m = _NCCL_LOG_IN_RE.search(s, pos)
        if m is None:
            return None
        letter = _LETTER_RE.search(s, m.start(1), m.end(1))
        if letter is not None:
            return letter.start()
        pos = m.end(1)  # "0:1:2 [0] ...": no host name here; the next run may hold one

NCCL_TIME_MEASURED = "nccl-tests: rank 0's mean over its timed loop (the loop's wall time / iterations)"


def _block_world(path, b: _NcclBlock, world, notes) -> tuple[int, list]:
    """The block's rank count: --world when given, else one more than the highest '#  Rank'
    line (a poster may keep only some of those lines, so their count is not the world)."""
    hosts = []
    if b.ranks:
        top = max(b.ranks)
        if world is not None:
            if int(world) <= top:
                raise err(path, b.line, f"the file lists rank {top} ('#  Rank' lines), --world says {world}")
            n = int(world)
        else:
            n = top + 1
        if len(b.ranks) != n:
            notes.add(f"line {b.line}: the file has '#  Rank' lines for {len(b.ranks)} of {n} ranks; world {n} "
                      + ("from --world" if world is not None else f"from the highest rank ({top}): pass --world N "
                                                                   "if more ranks ran"))
        else:
            hosts = [b.ranks[r][0] for r in sorted(b.ranks)]
    elif world is not None:
        n = int(world)
    else:
        raise err(path, b.line, "no '#  Rank N Group G Pid P on HOST device D' lines: pass --world N")
    return n, hosts


def parse_nccl_stdout(path, lines, world=None, benchmark=None, emit=None) -> dict:
    """Stream an nccl-tests stdout (an iterable of lines): each row goes to emit(row) as
    its line is read; returns the run's meta."""
    if isinstance(lines, str):
        lines = lines.splitlines()
    blocks: list[_NcclBlock] = []
    cur = _NcclBlock(1)
    versions: dict = {}
    in_table = False
    notes = Notes()
    hosts_all, gpus, worlds = [], set(), []
    piece = None  # a size line that NCCL log lines cut: its parts so far
    after_log = False  # the line before was an NCCL log line
    nlines = 0

    def close(b: _NcclBlock, at: int):
        if b.header is not None:
            if not b.footer:
                last = f" after line {b.last_data}" if b.last_data else ""
                notes.add(f"line {b.header['line']}: the table ends without its footer ('# Out of bounds values'): "
                          f"the output may have been cut{last}")
            blocks.append(b)

    def start_table(b: _NcclBlock):
        name = benchmark or (benchmark_name(b.name) if b.name else None) or name_from_filename(path)
        if name is None:
            raise err(path, b.line, "cannot tell the collective: no '# Collective test starting: X_perf' line "
                                     "and the file name names none (pass --benchmark)")
        b.bench = name
        b.world, hosts = _block_world(path, b, world, notes)
        worlds.append(b.world)
        hosts_all[:] = hosts_all or hosts
        gpus.update(b.ranks[r][3] for r in b.ranks)

    def data(lineno, toks):
        b = cur
        d = _nccl_data_line(path, lineno, toks, b.header)
        b.last_data = lineno
        _emit_rows(path, lineno, d, b, emit, notes)

    def drop_piece():
        """A part of a size line whose rest never came: beside NCCL log lines (ranks printing
        at once) it is said and the table goes on; alone it is a cut row, refused."""
        nonlocal piece
        p, piece = piece, None
        if not p.logged:
            data(p.line, p.toks)  # raises: too few fields
            return
        notes.add(f"line {p.line}: part of a size line ({len(p.toks)} of {cur.header['ncols']} fields) beside "
                  f"NCCL log lines, skipped: {' '.join(p.toks)[:60]!r}")

    def take(i, line, toks, beside, glued=False):
        """A table line's fields: a whole row is read; a part of one (fewer fields than the
        header) waits for its rest, which may come after NCCL log lines."""
        nonlocal piece
        numeric = bool(toks) and re.match(r"^[-+]?\d", toks[0]) is not None
        if piece is not None:
            joined = piece.toks + toks
            miss = _fields_missing(joined, cur.header)
            logged = piece.logged or beside or glued  # parts are joined only where a log line cut them
            if miss == 0 and logged:
                start, parts = piece.line, piece.parts + 1
                piece = None
                notes.add(f"line {start}: a size line cut in two by an NCCL log line, read with its rest on line {i}"
                          if parts == 2 else
                          f"line {start}: a size line cut in {parts} parts by NCCL log lines, read with its rest on "
                          f"line {i}")
                data(start, joined)
                return
            if numeric and miss > 0 and logged:
                piece.toks, piece.parts, piece.logged = joined, piece.parts + 1, True
                return
            if numeric:
                drop_piece()
        if not numeric:  # not a row (a launcher's warning): said; a part before it waits on
            notes.unknown(i, line, f" (inside the nccl-tests table of line {cur.header['line']})")
        elif _fields_missing(toks, cur.header) > 0:
            piece = _Piece(i, toks, beside or glued)
        else:
            data(i, toks)

    for i, s in numbered_lines(lines):
        nlines = i
        s = s.strip()
        if not s:
            continue
        beside, after_log = after_log, False
        if s.startswith("#"):
            if piece is not None:
                drop_piece()
            body = s.lstrip("#").strip()
            m = re.match(r"Collective test starting:\s*(\S+)", body)
            if m:
                if cur.header is not None or cur.ranks:
                    close(cur, i)
                    cur = _NcclBlock(i)
                cur.name = m.group(1)
                in_table = False
                continue
            m = re.search(r"nccl-tests version\s+(\S+)", body)
            if m:
                versions["nccl-tests"] = m.group(1)
                lib = re.search(r"nccl-library=(\d+)", body)
                if lib and _nccl_version(lib.group(1)):
                    versions["nccl"] = _nccl_version(lib.group(1))
                continue
            m = _RANK_RE.match(s.lstrip("#").strip()) if "Rank" in body else None
            if m:
                if cur.header is not None:
                    close(cur, i)
                    prev, cur = cur, _NcclBlock(i)
                    cur.name, cur.run_params = prev.name, prev.run_params
                    in_table = False
                cur.ranks[int(m.group(1))] = (m.group(2), int(m.group(3)), m.group(4), m.group(5).strip())
                continue
            if body.startswith("nThread"):
                cur.run_params = _parse_nccl_params(body)
                continue
            if "out-of-place" in body or "in-place" in body:
                cur.group_line = body
                continue
            toks = body.split()
            if "size" in toks and ("algbw" in toks or "busbw" in toks):
                if cur.header is not None:  # a second table in one block: keep them apart
                    close(cur, i)
                    prev, cur = cur, _NcclBlock(i)
                    cur.name, cur.ranks, cur.run_params = prev.name, prev.ranks, prev.run_params
                cur.line = cur.line if cur.ranks else i
                cur.header = _nccl_header(toks, cur.group_line, path, i)
                start_table(cur)
                in_table = True
                continue
            m = re.match(r"Out of bounds values\s*:\s*(\d+)", body)
            if m:
                if cur.header is None:
                    raise err(path, i, "nccl-tests footer without a table header before it")
                cur.footer, cur.out_of_bounds, in_table = True, int(m.group(1)), False
                continue
            m = re.match(r"Avg bus bandwidth\s*:\s*(\S+)", body)
            if m:
                try:
                    cur.avg_busbw = float(m.group(1))
                except ValueError:
                    pass
                continue
            continue
        m = re.search(r"NCCL version (\d+\.\d+\.\d+\S*)", s)
        if m and "NCCL INFO" in s:
            versions.setdefault("nccl", m.group(1).split("+")[0])
        log_at = nccl_log_start(s)
        if log_at is not None:
            notes.count("NCCL log (INFO/WARN)", i)
            after_log = True
            if in_table and log_at > 0:
                take(i, s, s[:log_at].split(), beside, glued=True)
            elif piece is not None:
                piece.logged = True
            continue
        if not in_table:
            if s[0].isdigit() and cur.header is None:
                notes.unknown(i, s, " (a number line before any nccl-tests table header)")
            elif not re.match(r"NCCL version", s):
                notes.unknown(i, s)
            continue
        take(i, s, s.split(), beside)
    if piece is not None:
        drop_piece()
    if cur.header is not None:
        close(cur, nlines)
    if not blocks:
        raise err(path, 1, f"no nccl-tests table (a '#  size  count  type ... algbw  busbw' header) in "
                            f"{nlines} lines: not nccl-tests stdout")
    for b in blocks:
        if b.skipped:
            notes.add(f"{b.name or b.bench}: {b.skipped} size-0 line(s) skipped")
        if b.invalid:
            notes.add(f"{b.name or b.bench}: {b.invalid} result(s) without a valid time (zero, negative or NaN) "
                      f"left out")
    meta = run_meta("nccl-tests", path, sum(b.rows for b in blocks), hosts_all, sorted(gpus), max(worlds), "nccl",
                    "cuda", versions, {}, notes=notes.lines(),
                    extra={"tool": {"name": "nccl-tests", "version": versions.get("nccl-tests")},
                           "tool_settings": blocks[0].run_params,
                           "out_of_bounds": sum(b.out_of_bounds or 0 for b in blocks),
                           "tool_avg_busbw_gbps": [b.avg_busbw for b in blocks]})
    return meta


def _check_world(b: _NcclBlock, lineno: int, algbw: float, busbw, notes) -> None:
    """nccl-tests' busbw is its algbw times its factor for the world it ran, both printed
    to two decimals: a world whose factor is off by more than that rounding (a cut rank
    list, a wrong --world) is said. Checked once per table, on its first line with algbw
    >= 1 GB/s."""
    b.ratio_checked = True
    f = busbw_factor(b.bench, b.world)
    if busbw is None or not math.isfinite(busbw) or f <= 0:
        return
    ratio = busbw / algbw
    if abs(ratio - f) > 0.0051 / algbw * (1 + ratio) + 1e-4:
        notes.add(f"line {lineno}: the file's busbw/algbw = {ratio:.3f}, but {b.bench} at world {b.world} has "
                  f"factor {f:.3f}: the run had another rank count (check --world)")


def _emit_rows(path, lineno: int, d: dict, b: _NcclBlock, emit, notes) -> None:
    """The rows of one size line (its out-of-place and in-place halves)."""
    h = b.header
    nbytes = d["lead"]["size"]
    if nbytes < 0:
        raise err(path, lineno, f"nccl-tests size {nbytes} is negative")
    if nbytes == 0:
        b.skipped += 1
        return
    clock = "cpu_time" if h["cputime"] else "host_clock_loop_mean"
    iters = b.run_params.get("iters")
    if iters and b.run_params.get("agg_iters"):
        iters *= b.run_params["agg_iters"]
    typ = d["lead"].get("type", "float")
    dtype = _NCCL_DTYPES.get(typ, typ)
    redop, root = d["lead"].get("redop"), d["lead"].get("root")
    params = _nccl_params(redop, root)
    for half, v in d["halves"].items():
        t = v.get("time", v.get("cputime"))
        if t is None:  # zero, negative or NaN (_nccl_data_line): said, never silent
            b.invalid += 1
            continue
        if not b.ratio_checked and (v.get("algbw") or 0) >= 1.0:
            _check_world(b, lineno, v["algbw"], v.get("busbw"), notes)
        stats, spread, note = {}, "none", "only the mean: min/p90/p99/max are not in the file"
        if v.get("i_min") is not None:
            stats = {"time_us_min": v.get("i_min"), "time_us_max": v.get("i_max"), "time_us_p99": v.get("i_p99")}
            if v.get("i_cv%") is not None:
                stats["time_us_std"] = v["i_cv%"] / 100.0 * t
                spread = "std"
            note = "-I per-iteration columns give min/max/p99 and std (cv); p90 is not in the file"
        extra = {"tool_nbytes": nbytes, "redop": redop, "root": root, "source_line": lineno}
        if d.get("timestamp"):
            extra["timestamp"] = d["timestamp"]
        b.rows += 1
        emit(make_row(
            bench=b.bench, backend="nccl", device="cuda", world=b.world, nbytes=nbytes, dtype=dtype,
            in_place=half == "in-place", params=params, iters=iters,
            warmup=b.run_params.get("warmup"), clock=clock, mean_us=t, stats=stats,
            algbw=v.get("algbw"), busbw=v.get("busbw"), check=check_status(v.get("#wrong")),
            source=f"nccl-tests stdout ({note})", time_measured=NCCL_TIME_MEASURED, spread=spread, extra=extra))


class _Piece:
    """The fields so far of a size line that NCCL log lines cut into parts."""

    def __init__(self, line: int, toks: list[str], logged: bool):
        self.line, self.toks, self.logged, self.parts = line, toks, logged, 1


def _empty_redop(toks: list[str], h: dict) -> bool:
    """nccl-tests 2.9 and older print an empty redop field for tests without a reduction
    (alltoall): the line has one field fewer, and the redop's place holds the next number."""
    if len(toks) != h["ncols"] - 1 or "redop" not in h["lead"]:
        return False
    k = h["lead"].index("redop")
    return k < len(toks) and re.match(r"^-?\d", toks[k]) is not None


def _fields_missing(toks: list[str], h: dict) -> int:
    """How many fields a table line lacks (0: a whole row; below 0: too many)."""
    if (h["timestamp"] and len(toks) > h["ncols"]) or _empty_redop(toks, h):
        return 0
    return h["ncols"] - len(toks)


def _nccl_data_line(path, lineno: int, toks: list[str], h: dict) -> dict:
    n = h["ncols"]
    ts = None
    if h["timestamp"] and len(toks) > n:
        toks, ts = toks[:n], " ".join(toks[n:])
    if _empty_redop(toks, h):
        k = h["lead"].index("redop")
        toks = toks[:k] + [""] + toks[k:]
    if len(toks) != n:
        what = f"{n} fields ({' '.join(h['lead'])} + {' '.join(h['halves'][0][1])} per half)"
        raise err(path, lineno, f"malformed nccl-tests data line: expected {what}, got {len(toks)}: "
                                f"{' '.join(toks)[:60]!r}")
    lead = {}
    for col, tok in zip(h["lead"], toks):
        if col in ("size", "count", "root"):
            try:
                lead[col] = int(tok)
            except ValueError:
                raise err(path, lineno, f"malformed nccl-tests data line: {col} {quote(tok)} is not an integer") \
                    from None
        else:
            lead[col] = tok or None
    pos = len(h["lead"])
    halves = {}
    for name, cols in h["halves"]:
        vals = {}
        for col, tok in zip(cols, toks[pos:pos + len(cols)]):
            try:
                vals[col] = fnum(tok)
            except ValueError:
                raise err(path, lineno, f"malformed nccl-tests data line: {name} {col} {quote(tok)} is not a number") \
                    from None
        pos += len(cols)
        t = vals.get("time", vals.get("cputime"))
        if t is not None and not (math.isfinite(t) and t > 0):
            vals["time"] = vals["cputime"] = None  # a half that did not run
        halves[name] = vals
    return {"lead": lead, "halves": halves, "timestamp": ts}
