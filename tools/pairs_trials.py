"""How often `commbench run pairs` names what is wrong, on hosts where the truth is known:
five namespace hosts (tools/nhosts.py) under mpirun, one rank each (node mode), every link
shaped to a base rate (200 Mbit/s: the network, not the machine's cores, sets the pace), and
in each scenario:

  a  one link shaped to a third of the base (a different link each trial): runs whose
     verdict names that link and no node (target: at least 9 of 10);
  b  every link of one host shaped to a third (a different host each trial): runs whose
     verdict names that node and no link (target: at least 9 of 10);
  c  nothing shaped: runs whose verdict names no node and no link (target: 19 of 20).

Each run measures 1 MiB each way per exchange (42 ms at 200 Mbit/s, so the shaped link sets a
pair's time, not the 2 cores), 5 exchanges per pair and size, 3 repeats, re-tests 3: about
15 to 35 s a run. One line a run (also a JSON line in OUT/trials.jsonl), then the counts
against the targets, the verdict lines, and the heatmap of one run of scenario a (its
report). Exit status 1 when a scenario missed its target, 3 where the hosts cannot be made.

    .venv/bin/python tools/pairs_trials.py --trials a=10,b=10,c=20 --out results/pairs-trials
    .venv/bin/python tools/pairs_trials.py --short      # one run of each
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from nhosts import NHosts, Unavailable  # noqa: E402
from twohosts import ROOT, _env  # noqa: E402

SCENARIOS = {"a": "one link at a third", "b": "one host's every link at a third", "c": "nothing shaped"}
TARGETS = {"a": 0.9, "b": 0.9, "c": 0.95}
FULL = "a=10,b=10,c=20"
# One run: launch and set-up, 3 repeats x 5 rounds, the re-tests; a run past this is stuck.
RUN_TIMEOUT_S = 300


def parse_trials(text: str) -> dict[str, int]:
    """'a=10,b=10,c=20' -> {'a': 10, 'b': 10, 'c': 20}; a scenario left out runs no trial."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, n = part.partition("=")
        if key not in SCENARIOS or not n.isdigit():
            raise SystemExit(f"pairs_trials: error: --trials takes a=N,b=N,c=N (scenarios {', '.join(SCENARIOS)}), "
                             f"got {part!r}")
        out[key] = int(n)
    return out


def shaped_for(scenario: str, trial: int, names: list[str]):
    """What trial `trial` (0-based) of a scenario slows: a link (a pair of names) for a, a
    host for b, None for c; a different one each trial, in turn."""
    links = [(names[i], names[j]) for i in range(len(names)) for j in range(i + 1, len(names))]
    if scenario == "a":
        return links[trial % len(links)]
    if scenario == "b":
        return names[trial % len(names)]
    return None


def verdict_of(run_dir: Path) -> dict | None:
    """The pairs verdict meta.json keeps (None when the run left none)."""
    try:
        meta = json.loads((Path(run_dir) / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    vs = meta.get("pairs_verdicts") or ([meta["pairs_verdict"]] if meta.get("pairs_verdict") else [])
    return vs[0] if vs and isinstance(vs[0], dict) else None


def judged_right(scenario: str, shaped, verdict: dict | None) -> bool:
    """Whether the verdict names what was shaped and nothing else (no other node, link, or
    pair that is neither)."""
    if not verdict or verdict.get("slow_pairs"):
        return False
    nodes = sorted(verdict.get("slow_nodes") or [])
    links = sorted(tuple(sorted(x)) for x in verdict.get("slow_links") or [])
    if scenario == "a":
        return nodes == [] and links == [tuple(sorted(shaped))]
    if scenario == "b":
        return nodes == [shaped] and links == []
    return nodes == [] and links == []


def run_argv(args, out: Path) -> list:
    return ["run", "pairs", "--backend", "mpi", "--pairs-mode", "node", "--param", f"pairs.bw_nbytes={args.bw_nbytes}",
            "--param", f"pairs.iters={args.iters}", "--param", f"pairs.repeats={args.repeats}", "--param",
            f"pairs.retests={args.retests}", "--out", out]


def one_trial(nh: NHosts, args, scenario: str, trial: int, out: Path) -> dict:
    names = [h.hostname for h in nh.hosts]
    shaped = shaped_for(scenario, trial, names)
    slow = args.rate_mbit / args.slow_factor
    nh.reset()
    if scenario == "a":
        nh.shape(*shaped, slow)
    elif scenario == "b":
        nh.shape_host(shaped, slow)
    run_dir = out / f"{scenario}{trial + 1:02d}"
    t0 = time.monotonic()
    try:
        p = nh.mpirun(len(nh.hosts), run_argv(args, run_dir), timeout=RUN_TIMEOUT_S)
        code, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired:
        nh.kill_all()
        code, err = 124, f"no end after {RUN_TIMEOUT_S} s"
    verdict = verdict_of(run_dir)
    ok = code == 0 and judged_right(scenario, shaped, verdict)
    why = "" if code == 0 else " | ".join(x for x in err.strip().splitlines() if "error" in x.lower())[-300:] \
        or err.strip()[-300:]
    return {"scenario": scenario, "trial": trial + 1, "shaped": "-".join(shaped) if isinstance(shaped, tuple) else shaped,
            "ok": ok, "exit": code, "seconds": round(time.monotonic() - t0, 1), "run": str(run_dir),
            "line": (verdict or {}).get("line", why or "no verdict in meta.json"),
            "slow_nodes": (verdict or {}).get("slow_nodes"), "slow_links": (verdict or {}).get("slow_links")}


def heatmap(run_dir: Path) -> str:
    """The report of one run, and the heatmap in it (its path), or why there is none."""
    rep = run_dir / "report"
    p = subprocess.run([sys.executable, "-m", "commbench", "report", str(run_dir), "--out", str(rep)], cwd=ROOT,
                       env=_env(), capture_output=True, text=True, check=False, timeout=300)
    found = sorted(f for f in rep.rglob("*") if f.suffix in (".png", ".svg") and ("pair" in f.name.lower() or "heatmap" in f.name.lower()))
    if found:
        return str(found[0])
    return f"none in {rep} (report exit {p.returncode}{': ' + p.stderr.strip()[-200:] if p.returncode else ''})"


def target_count(scenario: str, runs: int) -> int:
    """How many of `runs` must be right: 9 of 10 for a and b, 19 of 20 for c."""
    return math.ceil(TARGETS[scenario] * runs - 1e-9)


def summary(results: list[dict], wanted: dict[str, int]) -> tuple[list[str], bool]:
    """The counts per scenario against its target, and whether every scenario met it."""
    lines, met = [], True
    for s, n in wanted.items():
        mine = [r for r in results if r["scenario"] == s]
        right, need = sum(r["ok"] for r in mine), target_count(s, len(mine))
        hit = bool(mine) and right >= need
        met &= hit
        lines.append(f"{s} ({SCENARIOS[s]}): {right} of {len(mine)} right "
                     f"(target: at least {need}) {'met' if hit else 'MISSED'}")
        for line in sorted({r["line"] for r in mine}):
            lines.append(f"    {sum(r['line'] == line for r in mine)}x  {line}")
    return lines, met


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="pairs_trials", description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", default=FULL, help=f"runs per scenario (default {FULL})")
    ap.add_argument("--short", action="store_true", help="one run of each scenario")
    ap.add_argument("--hosts", type=int, default=5)
    ap.add_argument("--rate-mbit", type=float, default=200.0, help="the base rate of every link")
    ap.add_argument("--slow-factor", type=float, default=3.0, help="a shaped link runs at the base rate over this")
    ap.add_argument("--bw-nbytes", type=int, default=1 << 20)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--retests", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "results" / f"pairs-trials-{time.strftime('%Y%m%d-%H%M%S')}"))
    args = ap.parse_args(argv)
    wanted = parse_trials("a=1,b=1,c=1" if args.short else args.trials)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    why = NHosts.unavailable()
    if why:
        print(f"pairs_trials: skipped: {why}", file=sys.stderr)
        return 3
    results = []
    try:
        with NHosts(args.hosts, rate_mbit=args.rate_mbit) as nh, open(out / "trials.jsonl", "a") as log:
            print(f"{args.hosts} hosts, every link {args.rate_mbit:g} Mbit/s, shaped ones {args.rate_mbit / args.slow_factor:.3g};"
                  f" pairs node mode, {args.bw_nbytes} B x {args.iters} exchanges, {args.repeats} repeats, "
                  f"{args.retests} re-tests: {out}", flush=True)
            for s, n in wanted.items():
                for t in range(n):
                    r = one_trial(nh, args, s, t, out)
                    results.append(r)
                    log.write(json.dumps(r) + "\n")
                    log.flush()
                    print(f"{s}{r['trial']:02d} shaped {r['shaped'] or '-':20s} {'right' if r['ok'] else 'WRONG'} "
                          f"{r['seconds']:5.1f} s  {r['line']}", flush=True)
    except Unavailable as e:
        print(f"pairs_trials: skipped: {e}", file=sys.stderr)
        return 3
    lines, met = summary(results, wanted)
    print("\n".join(lines))
    first_a = next((Path(r["run"]) for r in results if r["scenario"] == "a" and r["exit"] == 0), None)
    if first_a is not None:
        print(f"heatmap ({first_a.name}): {heatmap(first_a)}")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
