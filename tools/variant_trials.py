"""The variant verdicts, checked on this host: "clearly" faster or slower only on evidence.

Three counts, each from real runs back to back (2 ranks, the README's in-switch example):

  repeat   `commbench run inswitch --np 2 --worlds 2 --sizes 8,64K,4M --repeat 3`, TRIALS
           times: how many pairs of runs make opposite "clearly" claims (a variant clearly
           faster at a size in one run, clearly slower there in another). Target: none.
  single   the same without --repeat, once: how many times "clearly" is printed. Target: none.
  slower   a variant slower for real (tests/fixtures/variant_slower.toml: Open MPI's basic
           linear all_gather, a gather then a broadcast, against ring at 1-4 MiB) with
           --repeat 3, TRIALS times: in how many it is judged "clearly slower". Target: at
           least 4 of 5 (80 %).

A row measured while the host was busy is not evidence (docs/verdicts.md), so on a loaded
host every line may say "cannot judge": the summary says how many rows were usable. One JSON
line a run in OUT/trials.jsonl; exit 0 when every target is met, 1 otherwise.

    .venv/bin/python tools/variant_trials.py --trials 5 --out results/variant-trials
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INSWITCH = ["inswitch", "--worlds", "2", "--sizes", "8,64K,4M"]
SLOWER = [str(ROOT / "tests" / "fixtures" / "variant_slower.toml")]
SLOW_VARIANT, SLOW_BENCH = "ompi-linear", "all_gather"
SLOWER_SHARE = 0.8  # the positive case's target: judged clearly slower in 4 of 5 trials


def run_once(out: Path, suite_args: list[str], np_: int, repeat: int, timeout_s: float) -> dict:
    """One `commbench run`, then its variant claims: {"bench variant": {"faster": sizes,
    "slower": sizes}}, the verdict lines, how many times its output says "clearly", and its
    rows usable as evidence."""
    from commbench.analyse.verdicts import untrusted_reason
    from commbench.report.variants_view import variant_comparisons
    from commbench.store.load import load

    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "commbench", "run", *suite_args, "--np", str(np_), "--out", str(out)]
    cmd += ["--repeat", str(repeat)] if repeat > 1 else []
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"out": str(out), "error": f"ran past {timeout_s:g} s"}
    rec = {"out": str(out), "seconds": round(time.monotonic() - t0, 1), "exit": p.returncode,
           "clearly_printed": (p.stdout + p.stderr).count("clearly"), "load_avg": os.getloadavg()[0]}
    if not (out / "rows.jsonl").is_file():
        return {**rec, "error": p.stderr.strip()[-400:]}
    df = load(out, warn=lambda line: None)
    rec["rows"], rec["usable_rows"] = len(df), int(sum(not untrusted_reason(r) for r in df.to_dict("records")))
    rec["claims"], rec["lines"] = {}, []
    for c in variant_comparisons(df):
        rec["lines"] += c["lines"]
        for v, got in c["claims"].items():
            rec["claims"][f"{c['benchmark']} {v}"] = got
    return rec


def opposite(a: dict, b: dict) -> list[str]:
    """Where two runs make opposite claims: 'all_gather ompi-rabenseifner 4194304'."""
    out = []
    for key in sorted(set(a) & set(b)):
        for s in sorted((set(a[key]["faster"]) & set(b[key]["slower"])) | (set(a[key]["slower"]) &
                                                                           set(b[key]["faster"]))):
            out.append(f"{key} {s}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=5, help="runs of the repeat and slower cases (default 5)")
    ap.add_argument("--only", default="repeat,single,slower", help="comma list of the cases to run")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds a run may take")
    ap.add_argument("--out", default="results/variant-trials")
    a = ap.parse_args(argv)
    cases = [c for c in a.only.split(",") if c]
    if a.trials < 1 or not cases or set(cases) - {"repeat", "single", "slower"}:
        print("variant_trials: error: --trials must be at least 1 and --only a comma list of repeat, single, slower",
              file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    log = open(out / "trials.jsonl", "a")
    summary, ok = [], True

    def record(case, i, rec):
        log.write(json.dumps({"case": case, "trial": i, **rec}) + "\n")
        log.flush()
        usable = f"{rec.get('usable_rows', 0)}/{rec.get('rows', 0)} rows usable"
        print(f"{case} {i}: {rec.get('error') or usable}; " + "; ".join(rec.get("lines", [])), flush=True)

    if "repeat" in cases:
        recs = []
        for i in range(1, a.trials + 1):
            recs.append(run_once(out / f"repeat{i}", INSWITCH, a.np, 3, a.timeout))
            record("repeat", i, recs[-1])
        done = [r for r in recs if "claims" in r]
        flips = [(i, j, o) for (i, x), (j, y) in itertools.combinations(enumerate(done, 1), 2)
                 if (o := opposite(x["claims"], y["claims"]))]
        claims = [sum(len(c["faster"]) + len(c["slower"]) for c in r["claims"].values()) for r in done]
        ok &= not flips and len(done) == len(recs)
        summary.append(f"in-switch --repeat 3: {len(done)} of {len(recs)} runs done; pairs of runs with opposite "
                       f"\"clearly\" claims: {len(flips)} of {math.comb(len(done), 2)} (target 0)"
                       + "".join(f"; runs {i} and {j}: {', '.join(o)}" for i, j, o in flips)
                       + f"; sizes claimed per run: {' '.join(map(str, claims)) or '-'}; usable rows per run: "
                       + " ".join(f"{r.get('usable_rows', 0)}/{r.get('rows', 0)}" for r in recs))
    if "single" in cases:
        rec = run_once(out / "single", INSWITCH, a.np, 1, a.timeout)
        record("single", 1, rec)
        claimed = sum(len(c["faster"]) + len(c["slower"]) for c in rec.get("claims", {}).values())
        ok &= "claims" in rec and claimed == 0 and rec["clearly_printed"] == 0
        summary.append(f"in-switch, one run: \"clearly\" printed {rec.get('clearly_printed', '-')} time(s), sizes "
                       f"claimed {claimed} (target 0 and 0)" + (f"; error: {rec['error']}" if "error" in rec else ""))
    if "slower" in cases:
        hits, recs = 0, []
        for i in range(1, a.trials + 1):
            recs.append(run_once(out / f"slower{i}", SLOWER, a.np, 3, a.timeout))
            record("slower", i, recs[-1])
            got = recs[-1].get("claims", {}).get(f"{SLOW_BENCH} {SLOW_VARIANT}", {})
            hits += bool(got.get("slower")) and not got.get("faster")
        need = math.ceil(SLOWER_SHARE * a.trials)
        ok &= hits >= need
        summary.append(f"{SLOW_VARIANT} {SLOW_BENCH} vs ring, 1-4 MiB, --repeat 3: judged \"clearly slower\" in "
                       f"{hits} of {a.trials} trials (target at least {need}); usable rows per run: "
                       + " ".join(f"{r.get('usable_rows', 0)}/{r.get('rows', 0)}" for r in recs))
    log.close()
    print("\n".join(["summary:"] + summary + [f"load average now {os.getloadavg()[0]:.1f}; "
                                              f"{'every target met' if ok else 'a target missed'}"]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
