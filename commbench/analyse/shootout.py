"""The dispatcher shoot-out: per workload, the MoE dispatchers that ran on the same routing
and tokens ranked by dispatch + combine time, and the winner named only where the repeats
say so (docs/moe.md, "The shoot-out"; docs/verdicts.md says the rule).

Pure: rows in (dicts, as rows.jsonl holds them), contests out. A contest is one workload
(the routing and its knobs, or the trace) at one run, backend, world and table: prefill
and decode are ranked apart, each among the dispatchers that serve it (tables_of). The
dispatcher is a sweep axis inside a launch, so repeat k of every
dispatcher ran in the same launch, and `--repeat N` makes each repeat a launch of its own.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field

from commbench.analyse.intervals import _num
from commbench.analyse.speedups import MIN_PAIRS, repeat_of
from commbench.analyse.verdicts import CANNOT_JUDGE, untrusted_reason
from commbench.core.schema import has

# Params that say which dispatcher ran, not what it moved: left out of the workload.
DISPATCH_KEYS = ("dispatcher", "copies", "mode", "path", "capacity")
STAGES = ("dispatch", "combine")
TABLES = ("prefill", "decode")
_RUNS_EACH = {0: "no repeat of both", 1: "one run each", 2: "two runs each"}
_TO_JUDGE = f"--repeat {MIN_PAIRS} to judge"


@dataclass
class Entry:
    """One dispatcher in one contest. Times are medians over its complete repeats (both
    stages measured): dispatch_us and combine_us of each stage's p50, total_us of the
    per-repeat sums. algorithmic_gbps: the rank's logical bytes (rows received, its own
    tokens included: DeepEP's count) of both stages / total_us; physical_gbps: the bytes
    that left the rank (remote) / total_us."""

    dispatcher: str
    dispatch_us: float
    combine_us: float
    total_us: float
    repeats: int
    algorithmic_gbps: float = math.nan
    physical_gbps: float = math.nan
    x_best: float = math.nan
    deciding: str = ""  # where it loses most to the best (the best: where it gains most over the runner-up)
    clearly_slower: bool = False  # than the best, by the same rule as the winner's (judge)
    laps_us: dict = field(default_factory=dict)  # (stage, lap or "") -> median us


@dataclass
class Contest:
    run: str
    backend: str
    world: int
    table: str          # prefill or decode
    workload: str       # its label ("zipf alpha=1.0", "trace routing.npz")
    key: str            # the workload's params, as JSON (what the points shared)
    entries: list = field(default_factory=list)   # ranked, fastest first
    clearly: bool = False
    why: str = ""       # what the verdict rests on, or why it cannot judge
    failed: list = field(default_factory=list)    # [(dispatcher, why)]: not ranked

    @property
    def winner(self) -> str | None:
        return self.entries[0].dispatcher if self.clearly else None

    def verdict(self) -> str:
        """'balanced: allgather 1.00, alltoall 1.31x (clearly, 3 repeats in fresh launches)'."""
        ranks = ", ".join(f"{e.dispatcher} 1.00" if i == 0 else f"{e.dispatcher} {e.x_best:.2f}x"
                          for i, e in enumerate(self.entries))
        # Without a winner (the first two too close to call), those that lost clearly to the
        # fastest are still named: a tie at the top says nothing about the rest.
        slower = [e.dispatcher for e in self.entries[1:] if e.clearly_slower]
        also = (f"; clearly slower than {self.entries[0].dispatcher}: {', '.join(slower)}"
                if slower and not self.clearly else "")
        return f"{self.workload}: {ranks} ({'clearly, ' if self.clearly else ''}{self.why}{also})"


def _text(v) -> str:
    return str(v) if has(v) else ""


def dispatcher_of(row) -> str:
    return _text((row.get("params") or {}).get("dispatcher"))


def tables_of(name: str, params: dict) -> tuple:
    """The tables a dispatcher's point ranks in: those the dispatcher serves (its
    registry entry), a low-latency point in decode alone; by its mode where the dispatcher
    is not registered here (a plug-in not loaded): low_latency decode, else prefill. A
    dispatcher that serves both (allgather, the MPI ones) ranks in both, against each
    table's own."""
    if params.get("mode") == "low_latency":
        return ("decode",)
    try:
        from commbench.benchmarks.moe.dispatchers import DISPATCHERS
    except ImportError:
        DISPATCHERS = {}
    d = DISPATCHERS.get(name)
    served = tuple(t for t in TABLES if d is not None and t in d.serves)
    return served or ("prefill",)


def workload_params(params: dict) -> dict:
    return {k: v for k, v in (params or {}).items() if k not in DISPATCH_KEYS}


def workload_label(params: dict, world: int) -> str:
    """The routing and its own knobs (or the trace's file name). Other params (steps,
    tokens, seed) are named only where they tell two workloads apart (_distinguish)."""
    p = params or {}
    trace = _text(p.get("trace"))
    if trace:
        head = f"trace {trace.replace(chr(92), '/').rsplit('/', 1)[-1]}"
    else:
        head = _text(p.get("routing")) or "?"
        own = _routing_knobs(p, world)
        head += "".join(f" {k}={v}" for k, v in own.items())
    return head


def _routing_knobs(p: dict, world: int) -> dict:
    """The routing's own params (MoE.routing_params), as the rows hold them."""
    from commbench.benchmarks.moe import MoE

    full = {**{k: spec.default for k, spec in MoE.params.items()}, **p}  # rows of an older version lack some
    try:
        own = MoE.routing_params(full, world)
    except (KeyError, TypeError, ValueError):  # a routing this version does not know: its name alone
        return {}
    return {k: p.get(k, v) for k, v in own.items()}


def _distinguish(labels: dict) -> dict:
    """key -> label, with the params that tell apart two workloads that share a label."""
    out = {}
    for key, label in labels.items():
        twins = [k for k, lab in labels.items() if lab == label and k != key]
        if twins:
            mine = json.loads(key)
            differ = sorted({p for t in twins for p, v in json.loads(t).items() if mine.get(p) != v}
                            | {p for t in twins for p in mine if p not in json.loads(t)})
            label += "".join(f" {p}={mine.get(p)}" for p in differ)
        out[key] = label
    return out


def row_problem(row) -> str:
    """Why a row cannot be evidence: it failed its exact check, or verdicts.untrusted_reason."""
    if _text(row.get("check")) == "fail":
        return "failed its check"
    return untrusted_reason(row)


# --- one dispatcher's repeats ------------------------------------------------------------

def _by_repeat(rows) -> dict[int, dict]:
    """repeat -> {stage: row} (the first row of each; a repeat with one stage only is kept,
    incomplete)."""
    out: dict[int, dict] = {}
    for r in rows:
        out.setdefault(repeat_of(r), {}).setdefault(_text(r.get("stage")), r)
    return out


def _complete(reps: dict) -> dict[int, dict]:
    return {k: s for k, s in reps.items() if all(st in s for st in STAGES)}


def _laps(stage_row: dict, stage: str) -> dict:
    out = {(stage, ""): _num(stage_row.get("time_us_p50"))}
    for k, v in stage_row.items():
        if k.startswith("stage_us_") and math.isfinite(_num(v)):
            out[(stage, k[len("stage_us_"):])] = _num(v)
    return out


def _entry(name: str, reps: dict) -> Entry:
    comp = _complete(reps)
    ks = sorted(comp)
    d = [_num(comp[k]["dispatch"]["time_us_p50"]) for k in ks]
    c = [_num(comp[k]["combine"]["time_us_p50"]) for k in ks]
    total = statistics.median(a + b for a, b in zip(d, c))
    laps: dict = {}
    for k in ks:
        for st in STAGES:
            for lap, v in _laps(comp[k][st], st).items():
                laps.setdefault(lap, []).append(v)
    e = Entry(name, statistics.median(d), statistics.median(c), total, len(ks),
              laps_us={lap: statistics.median(v) for lap, v in laps.items()})
    first = comp[ks[0]]
    for attr, col in (("algorithmic_gbps", "logical_nbytes"), ("physical_gbps", "remote_nbytes")):
        nbytes = sum(_num(first[st].get(col)) for st in STAGES)
        if math.isfinite(nbytes) and total > 0:
            setattr(e, attr, nbytes / (total * 1e3))  # bytes / us / 1e3 = GB/s (1e9 B)
    return e


def deciding_part(fast: Entry, slow: Entry) -> str:
    """Where `fast` gains most over `slow`: the stage (dispatch or combine) with the larger
    gap in median p50, and inside it the sub-stage lap (stage_us_*, both dispatchers have
    it) with the larger gap. 'combine: reduce 41 us' ('-' when fast gains nowhere)."""
    gap = {st: slow.laps_us.get((st, ""), math.nan) - fast.laps_us.get((st, ""), math.nan) for st in STAGES}
    gap = {st: g for st, g in gap.items() if math.isfinite(g)}
    if not gap or max(gap.values()) <= 0:
        return "-"
    stage = max(gap, key=gap.get)
    laps = {lap: slow.laps_us[(st, lap)] - v for (st, lap), v in fast.laps_us.items()
            if st == stage and lap and (st, lap) in slow.laps_us}
    laps = {lap: g for lap, g in laps.items() if g > 0}
    if laps:
        lap = max(laps, key=laps.get)
        return f"{stage}: {lap} {laps[lap]:.0f} us"
    return f"{stage} {gap[stage]:.0f} us"


# --- the verdict -------------------------------------------------------------------------

def _launch(stage_rows: dict) -> str | None:
    ids = {_text(r.get("launch")) for r in stage_rows.values()}
    return ids.pop() if len(ids) == 1 and "" not in ids else None


def judge(win_reps: dict, run_reps: dict, dropped: int = 0, why_dropped: str = "", ran: int = 0) -> tuple[bool, str]:
    """(clearly, what it rests on / why not) for the fastest dispatcher against the
    runner-up, from each one's repeats (repeat -> {stage: row}, evidence only). Clearly
    only on at least MIN_PAIRS repeats both hold whole, each repeat one launch that both
    dispatchers' rows share (the dispatcher is swept inside a launch), every repeat in a
    launch of its own (repeats in one launch share its speed), and in every repeat the
    winner's dispatch + combine p90 below the runner-up's p50 sum: nine in ten of its
    steps beat the runner-up's median, every time the launch was fresh. dropped: rows of
    the two left out (why_dropped says why); ran: the repeats both measured, those rows
    included."""
    w, r = _complete(win_reps), _complete(run_reps)
    ks = sorted(set(w) & set(r))
    n = len(ks)
    drop = f"; {dropped} row(s) not used: {why_dropped}" if dropped else ""
    ran = max(ran, n)
    if n < MIN_PAIRS and ran >= MIN_PAIRS:  # repeats enough, but the host disturbed some
        return False, f"{CANNOT_JUDGE}: {n} of {ran} repeats usable{drop}"
    if n < MIN_PAIRS:
        return False, f"{CANNOT_JUDGE}: {_RUNS_EACH.get(ran, f'{ran} runs each')}{drop}; {_TO_JUDGE}"
    launches = []
    for k in ks:
        a, b = _launch(w[k]), _launch(r[k])
        if a is None or b is None:
            return False, (f"{CANNOT_JUDGE}: {n} repeats, not recorded as launches of their own (rows without a "
                           f"launch id){drop}; run --np N {_TO_JUDGE}")
        if a != b:
            return False, f"{CANNOT_JUDGE}: in repeat {k} the two dispatchers ran in different launches{drop}"
        launches.append(a)
    if len(set(launches)) < len(launches):
        return False, (f"{CANNOT_JUDGE}: {n} repeats, not each in a fresh launch (repeats in one launch share its "
                       f"speed){drop}; run --np N {_TO_JUDGE}")
    p90 = [sum(_num(w[k][st].get("time_us_p90")) for st in STAGES) for k in ks]
    p50 = [sum(_num(r[k][st].get("time_us_p50")) for st in STAGES) for k in ks]
    lost = sum(not (a < b) for a, b in zip(p90, p50))
    if lost:
        return False, (f"{CANNOT_JUDGE}: the repeats disagree (in {lost} of {n} the winner's p90 is not below the "
                       f"runner-up's p50){drop}")
    return True, f"{n} repeats in fresh launches{drop}"


def _contest(c: Contest, by_disp: dict) -> Contest:
    """Rank one contest's dispatchers and judge the first against the second."""
    entries, evidence, unused = [], {}, {}
    for name, rows in sorted(by_disp.items()):
        ok = [r for r in rows if row_problem(r) != "failed its check"]
        reps = _by_repeat(ok)
        if not _complete(reps):
            c.failed.append((name, "failed its exact check" if len(ok) < len(rows) else
                             "no repeat measured both stages"))
            continue
        entries.append(_entry(name, reps))
        evidence[name] = _by_repeat([r for r in rows if not row_problem(r)])
        unused[name] = [row_problem(r).split(" (")[0] for r in rows if row_problem(r)]
    entries.sort(key=lambda e: (e.total_us, e.dispatcher))
    c.entries = entries
    if not entries:
        c.why = f"{CANNOT_JUDGE}: no dispatcher measured both stages"
        return c
    best = entries[0]
    for e in entries:
        e.x_best = e.total_us / best.total_us if best.total_us > 0 else math.nan
        e.deciding = deciding_part(best, e) if e is not best else ""
    if len(entries) < 2:
        c.why = "one dispatcher ran: nothing to rank it against"
        return c
    second = entries[1]
    best.deciding = deciding_part(best, second)
    why = unused[best.dispatcher] + unused[second.dispatcher]
    ran = len(set(_complete(_by_repeat(by_disp[best.dispatcher])))
              & set(_complete(_by_repeat(by_disp[second.dispatcher]))))
    c.clearly, c.why = judge(evidence[best.dispatcher], evidence[second.dispatcher], len(why),
                             ", ".join(f"{why.count(k)} {k}" for k in dict.fromkeys(why)), ran)
    for e in entries[1:]:  # each against the fastest, on the same evidence rule
        e.clearly_slower = judge(evidence[best.dispatcher], evidence[e.dispatcher])[0]
    return c


def _split_settings(by_disp: dict) -> dict:
    """A dispatcher that leaves copies, mode or path to the sweep (the MPI ones, allgather)
    and ran at several of them: one entry per setting, named by what differs
    ('mpi-alltoallw copies=expert'), never one entry mixing them."""
    out: dict = {}
    for name, rows in by_disp.items():
        def sig(r):
            return tuple(_text((r.get("params") or {}).get(k)) for k in DISPATCH_KEYS[1:])
        sigs = {sig(r) for r in rows}
        vary = [i for i in range(len(DISPATCH_KEYS) - 1) if len({x[i] for x in sigs}) > 1]
        for r in rows:
            own = sig(r)
            out.setdefault(name + "".join(f" {DISPATCH_KEYS[1 + i]}={own[i]}" for i in vary), []).append(r)
    return out


def contests(rows) -> list[Contest]:
    """Every contest the rows hold: moe rows of a named dispatcher, by run, backend,
    world, table and workload; a contest only where more than one dispatcher ran in its
    run (a run of one dispatcher has no shoot-out)."""
    groups: dict[tuple, dict] = {}
    labels: dict[tuple, dict] = {}
    for r in rows:
        name = dispatcher_of(r)
        if _text(r.get("benchmark")) != "moe" or not name or _text(r.get("stage")) not in STAGES:
            continue
        p = r.get("params") or {}
        wk = json.dumps(workload_params(p), sort_keys=True, default=str)
        for table in tables_of(name, p):
            head = (_text(r.get("run")), _text(r.get("backend")), int(_num(r.get("world"))), table)
            groups.setdefault(head + (wk,), {}).setdefault(name, []).append(r)
            labels.setdefault(head, {})[wk] = workload_label(p, head[2])
    runs_many = {}
    for key, by in groups.items():
        runs_many.setdefault(key[0], set()).update(by)
    out = []
    for head, labs in labels.items():
        if len(runs_many[head[0]]) < 2:
            continue
        for wk, label in _distinguish(labs).items():
            c = Contest(head[0], head[1], head[2], head[3], label, wk)
            out.append(_contest(c, _split_settings(groups[head + (wk,)])))
    out.sort(key=lambda c: (c.run, c.backend, c.world, TABLES.index(c.table), c.workload))
    return out


def has_shootout(rows) -> bool:
    """Do the rows hold moe rows of more than one dispatcher in one run?"""
    seen: dict = {}
    for r in rows:
        if _text(r.get("benchmark")) == "moe" and dispatcher_of(r):
            seen.setdefault(_text(r.get("run")), set()).add(dispatcher_of(r))
    return any(len(v) > 1 for v in seen.values())


def skipped(metas: dict) -> list[dict]:
    """The dispatchers a run skipped (meta.json `skipped_points`), one entry per run,
    table, dispatcher and reason: {"run", "backend", "table", "dispatcher", "reason",
    "points"}. metas: run name -> meta.json."""
    out: dict[tuple, dict] = {}
    for run, meta in (metas or {}).items():
        meta = meta or {}
        for s in meta.get("skipped_points") or []:
            if not isinstance(s, dict) or s.get("benchmark", "moe") != "moe":
                continue
            p = s.get("params") or {}
            name = _text(p.get("dispatcher"))
            if not name:
                continue
            for table in tables_of(name, p):
                key = (run, _text(meta.get("backend")), table, name, _text(s.get("reason")))
                e = out.setdefault(key, dict(zip(("run", "backend", "table", "dispatcher", "reason"), key),
                                             points=set()))
                e["points"].add(json.dumps(p, sort_keys=True, default=str))  # once, whatever the repeats
    return [{**e, "points": len(e["points"])} for e in out.values()]
