"""The regression gate, checked: short all_reduce sweeps run A/B interleaved, then judged by
`commbench compare A1 A2 A3 -- B1 B2 B3 --fail-on-regression`, many rounds over.

Each round runs A1 B1 P1 A2 B2 P2 A3 B3 P3 (interleaved, so a neighbour that loads the machine
for a minute lands on both sides; each trio in a shuffled order, seeded by the round), where A
and B are the same code and P plants a slowdown (commbench/run/plant.py, a test hook) on PLANTED
points. The A and B sides plant the same points at 0 %, so every side times them through the
same loop and the delay is the only difference. Per round: the same-code compare's exit status
(right when nothing is slower: 0, or 3 when some points could not be judged), the planted one's
(1 is right), which points it flagged.

Each run measures every point four times (`run --repeat 4`, 5 ms a point: 11-15 s a run on
2 cores), each repeat in a launch of its own, and compare takes each run's fastest repeat of a
point (compare.fold_repeats). Why fresh launches: on this kind of host a process can hold a
point at one of several speeds for its whole life (float32 16 KiB at 7.8 us in some launches,
10.2 us in others, every repeat alike), and three runs a side that all drew the slow speed read
as a change; a point can also run 2-3x slow for seconds at a time, which an interleaved repeat
lands outside of. A change no larger than the spread of a point's repeats is "cannot judge"
(analyse/repeat_guards.py).

One JSON line a round in OUT/rounds.jsonl, and the counts at the end:

    .venv/bin/python tools/ab_gate.py --rounds 20 --out results/ab-gate
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The largest planted delay, per cent (as COMMBENCH_PLANT_DELAY_PCT takes it: docs/verdicts.md).
MAX_PCT = 1000.0
# 99 points: 8 B..512 KiB in steps of 2 and 1.5 (33 sizes), three dtypes.
SIZES = sorted({b << k for b in (8, 12) for k in range(16)} | {512 << 10})
DTYPES = ("float32", "float16", "int32")
# Ten named points, float16 from 384 B to 384 KiB. Why float16: its reduction is CPU-bound
# and its repeats within a run spread 3-9 % on this kind of host, so a 20 % change is larger
# than the host's own movement there. float32 and int32 move between speed modes up to 3x
# apart in stretches of seconds (their repeats within a run spread 25-70 %): compare calls a
# 20 % change there "cannot judge", rightly (--planted can name such points to see it).
PLANTED = tuple(f"all_reduce:float16:{n}" for n in (384, 1024, 3072, 6144, 16384, 24576, 49152, 98304, 196608,
                                                      393216))


def run_side(out: Path, pct: float, np_: int, min_time_ms: float, repeat: int = 1, sizes=SIZES,
             dtypes=DTYPES, planted=PLANTED) -> float:
    env = {**os.environ, "COMMBENCH_PLANT_POINTS": ",".join(planted), "COMMBENCH_PLANT_DELAY_PCT": str(pct)}
    cmd = [sys.executable, "-m", "commbench", "run", "quick", "-b", "all_reduce", "--backend", "mpi",
           "--np", str(np_), "--worlds", str(np_), "--sizes", ",".join(map(str, sizes)), "--dtypes", ",".join(dtypes),
           "--min-time-ms", str(min_time_ms), "--repeat", str(repeat), "--no-check", "--out", str(out),
           # The gate compares times, not ceilings: a fixed profile skips the loopback probe,
           # which on a loaded host takes longer than the sweep itself.
           "--profile", "h100-hgx"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(f"ab_gate: error: run {out} exited {p.returncode}: {p.stderr.strip()[-500:]}")
    return time.monotonic() - t0


def compare(base, new, csv_out: Path) -> tuple[int, list[str], list[str]]:
    cmd = [sys.executable, "-m", "commbench", "compare", "--fail-on-regression", "--csv", str(csv_out),
           *map(str, base), "--", *map(str, new)]
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if p.returncode not in (0, 1, 3):  # 3: inconclusive (points not judged, none slower)
        raise SystemExit(f"ab_gate: error: compare exited {p.returncode}: {p.stderr.strip()[-500:]}")
    with open(csv_out) as f:
        rows = [(f"{r['benchmark']}:{r['dtype']}:{r['nbytes']}", r["verdict"]) for r in csv.DictReader(f)]
    return (p.returncode, [k for k, v in rows if v in ("slower", "faster")],
            [k for k, v in rows if v == "cannot judge"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3, help="runs a side")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--pct", type=float, default=20.0, help="planted slowdown, per cent")
    ap.add_argument("--min-time-ms", type=float, default=5.0)
    ap.add_argument("--run-repeat", type=int, default=4, help="run --repeat N inside each run")
    ap.add_argument("--out", default="results/ab-gate")
    ap.add_argument("--keep", action="store_true", help="keep the runs (default: only the compare CSVs)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)),
                    help="bytes, comma-separated (default: the 33 sizes the planted points are among)")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--planted", default=",".join(PLANTED),
                    help="the points to slow down, benchmark:dtype:bytes, comma-separated "
                         "(default: ten float16 points)")
    a = ap.parse_args(argv)
    try:
        sizes = [int(x) for x in a.sizes.split(",")]
    except ValueError:
        sizes = []
    dtypes = [x.strip() for x in a.dtypes.split(",") if x.strip()]
    if not sizes or min(sizes) < 1 or not dtypes:
        print(f"ab_gate: error: --sizes needs positive byte counts and --dtypes at least one dtype, got "
              f"{a.sizes!r} and {a.dtypes!r}", file=sys.stderr)
        return 2
    if a.rounds < 1 or a.repeats < 2 or a.np < 2 or a.run_repeat < 1:
        print("ab_gate: error: need --rounds >= 1, --repeats >= 2, --run-repeat >= 1 and --np >= 2", file=sys.stderr)
        return 2
    # The planted runs spin for pct % of each operation: inf or 1e9 would spin every rank until
    # the watchdog, after the same-code runs had already been made.
    if not (math.isfinite(a.pct) and 0 < a.pct <= MAX_PCT):
        print(f"ab_gate: error: --pct must be a number above 0 and at most {MAX_PCT:g} (per cent), got {a.pct:g}",
              file=sys.stderr)
        return 2
    out = Path(a.out).resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # an existing file, a place not writable
        why = "exists and is not a directory" if isinstance(e, FileExistsError) else e.strerror or e
        print(f"ab_gate: error: --out {a.out}: {why}", file=sys.stderr)
        return 2
    log = out / "rounds.jsonl"
    named = tuple(x.strip() for x in a.planted.split(",") if x.strip())
    if any(len(x.split(":")) != 3 or not x.rsplit(":", 1)[1].isdigit() for x in named):
        print(f"ab_gate: error: --planted takes benchmark:dtype:bytes points, got {a.planted!r}", file=sys.stderr)
        return 2
    planted = {x for x in named if int(x.rsplit(":", 1)[1]) in sizes and x.split(":")[1] in dtypes}
    if not planted:
        print("ab_gate: error: no planted point is in the sweep (--sizes, --dtypes): it could find nothing",
              file=sys.stderr)
        return 2
    for rnd in range(1, a.rounds + 1):
        rd = out / f"round{rnd:02d}"
        if rd.exists():
            shutil.rmtree(rd)
        sides = {"A": [], "B": [], "P": []}
        secs = []
        order = []
        for i in range(1, a.repeats + 1):
            # The three sides in a shuffled order each time (seeded by the round): B always
            # right after A would give B whatever the host does after A's run, every time.
            trio = [("A", 0.0), ("B", 0.0), ("P", a.pct)]
            random.Random(rnd * 1000 + i).shuffle(trio)
            for side, pct in trio:
                order.append(f"{side}{i}")
                d = rd / f"{side}{i}"
                secs.append(run_side(d, pct, a.np, a.min_time_ms, a.run_repeat, sizes, dtypes, named))
                sides[side].append(d)
        same_rc, same_flagged, same_nj = compare(sides["A"], sides["B"], rd / "same.csv")
        plant_rc, plant_flagged, plant_nj = compare(sides["A"], sides["P"], rd / "planted.csv")
        rec = {"round": rnd, "same_exit": same_rc, "same_flagged": same_flagged, "same_cannot_judge": len(same_nj),
               "planted_exit": plant_rc, "planted_found": sorted(planted & set(plant_flagged)),
               "planted_cannot_judge": sorted(planted & set(plant_nj)),
               "planted_others": sorted(set(plant_flagged) - planted), "run_s_max": round(max(secs), 1),
               "order": order}
        with open(log, "a") as f:
            f.write(json.dumps(rec) + "\n")
        print(f"round {rnd}: same code exit {same_rc} ({len(same_flagged)} flagged, {len(same_nj)} cannot judge); "
              f"planted exit {plant_rc}, "
              f"{len(rec['planted_found'])}/{len(planted)} planted found "
              f"({len(rec['planted_cannot_judge'])} cannot judge), "
              f"{len(rec['planted_others'])} others; "
              f"longest run {rec['run_s_max']} s", flush=True)
        if not a.keep:
            for d in sum(sides.values(), []):
                shutil.rmtree(d, ignore_errors=True)
    lines, ok = tally([json.loads(x) for x in open(log)][-a.rounds:], len(planted), a.pct)
    print("\n".join(lines))
    return 0 if ok else 1


def tally(recs: list, n_planted: int, pct: float) -> tuple[list[str], bool]:
    """The rounds' counts, and whether the gate met its targets. A same-code round is right
    when nothing is slower: exit 0, or 3 (inconclusive: points could not be judged, none
    slower), counted apart; a planted round when it exits 1 with at most one other point
    flagged."""
    n = len(recs)
    same_ok = sum(r["same_exit"] in (0, 3) for r in recs)
    same3 = sum(r["same_exit"] == 3 for r in recs)
    plant1 = sum(r["planted_exit"] == 1 for r in recs)
    clean = sum(r["planted_exit"] == 1 and len(r["planted_others"]) <= 1 for r in recs)
    found = sum(len(r["planted_found"]) for r in recs)
    every = sum(r["planted_exit"] == 1 and len(r["planted_found"]) == n_planted and len(r["planted_others"]) <= 1
                for r in recs)
    lines = [f"same code: nothing slower (compare exit 0 or 3) in {same_ok} of {n} rounds (want >= {n - n // 20}),"
             f" {same3} of them inconclusive (exit 3: points that could not be judged)",
             f"planted {pct:g} % on {n_planted} points: exit 1 in {plant1} of {n} rounds (want >= "
             f"{n - 2 * n // 20}), with at most 1 other point flagged in {clean}, and with every planted point "
             f"flagged too in {every}; planted points found {found} of {n_planted * n}"]
    return lines, same_ok >= n - n // 20 and clean >= n - 2 * n // 20


if __name__ == "__main__":
    sys.exit(main())
