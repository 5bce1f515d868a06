"""Trials of what compare says when the code did not change (or changed by a known amount)
and the runs were made as people make them. One flag per scenario, --trials N of each:

  --blocks       same code, a1 a2 a3 then b1 b2 b3 (`commbench run quick --np 2 -b
                 all_reduce,all_gather --sizes 8:64K`), judged by `compare --fail-on-regression
                 a1 a2 a3 -- b1 b2 b3`: trials with "faster"/"slower" at more than 1 point
                 (target: at most 1 in 10);
  --interleaved  same code, a1 b1 a2 b2 a3 b3 (`commbench ab --rounds 3`): trials with any
                 "slower" (target: none);
  --planted      a 20 % slowdown planted on the regression gate's ten float16 points and sweep
                 (tools/ab_gate.py; COMMBENCH_PLANT_POINTS / COMMBENCH_PLANT_DELAY_PCT, 0 % on
                 the A side), interleaved through `commbench ab`: trials where compare exits 1,
                 and which planted points it found;
  --hog          same code interleaved, the B side's launches beside a duty-cycled CPU hog
                 (one process per core, spin 20 ms, sleep 30 ms, started before and stopped
                 after each B run): trials with any "faster"/"slower" (target: at most 1 in 10)
                 and trials whose output says the host moved (the control measurement).

One line a trial (also a JSON line in OUT/trials.jsonl) and the counts at the end; the exit
status is 1 when a scenario missed its target. The full counts:

    .venv/bin/python tools/trust_trials.py --blocks --interleaved --planted --hog --trials 10 --out results/trust
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_gate import DTYPES, PLANTED, SIZES  # noqa: E402 (the gate's sweep and points, from its own file)

RUN_ARGS = ["quick", "--np", "2", "-b", "all_reduce,all_gather", "--sizes", "8:64K"]
# The gate's sweep (ab_gate.run_side): 99 all_reduce points, each repeat a launch of its own.
PLANT_RUN_ARGS = ["quick", "-b", "all_reduce", "--backend", "mpi", "--np", "2", "--worlds", "2",
                  "--sizes", ",".join(map(str, SIZES)), "--dtypes", ",".join(DTYPES), "--min-time-ms", "5",
                  "--repeat", "4", "--no-check", "--profile", "h100-hgx"]
HOG_SPIN_S, HOG_SLEEP_S = 0.020, 0.030
HOG_CODE = ("import time, sys\nspin, rest = float(sys.argv[1]), float(sys.argv[2])\nclock = time.perf_counter\n"
            "while True:\n    end = clock() + spin\n    while clock() < end:\n        pass\n    time.sleep(rest)\n")
# How long one command may take before the trial is called stuck (a run is seconds).
COMMAND_TIMEOUT_S = 1800


@contextmanager
def duty_hog(procs: int | None = None, spin_s: float = HOG_SPIN_S, sleep_s: float = HOG_SLEEP_S):
    """A neighbour that takes part of every core: one process per core spinning spin_s, then
    sleeping sleep_s, over and over, for as long as the block runs."""
    hogs = [subprocess.Popen([sys.executable, "-c", HOG_CODE, str(spin_s), str(sleep_s)])
            for _ in range(procs or os.cpu_count() or 1)]
    try:
        time.sleep(0.1)  # all of them spinning before the measured work starts
        yield hogs
    finally:
        for p in hogs:
            p.terminate()
        for p in hogs:
            p.wait()


def commbench(args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commbench", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=COMMAND_TIMEOUT_S)


def run(out: Path, run_args, env=None) -> None:
    p = commbench(["run", *run_args, "--out", out], env)
    if p.returncode != 0:
        raise SystemExit(f"trust_trials: error: run {out} exited {p.returncode}: {p.stderr.strip()[-500:]}")


def verdicts(csv_path: Path) -> dict[str, str]:
    """benchmark:dtype:bytes -> verdict, from compare's CSV (empty when it wrote none)."""
    if not csv_path.is_file():
        return {}
    with open(csv_path) as f:
        return {f"{r['benchmark']}:{r['dtype']}:{r['nbytes']}": r["verdict"] for r in csv.DictReader(f)}


def judged(d: Path, p: subprocess.CompletedProcess, csv_path: Path) -> dict:
    """What one trial's compare said: exit status, the points called changed, whether its
    words name the host's state (the control) and the order of the runs."""
    (d / "compare.txt").write_text(p.stdout + p.stderr)
    v = verdicts(csv_path)
    text = p.stdout + p.stderr
    return {"exit": p.returncode, "slower": sorted(k for k, x in v.items() if x == "slower"),
            "faster": sorted(k for k, x in v.items() if x == "faster"),
            "cannot_judge": sum(x == "cannot judge" for x in v.values()), "points": len(v),
            "host_moved": "host moved" in text, "not_interleaved": "not interleaved" in text}


def compare(d: Path, base, new) -> dict:
    csv_path = d / "compare.csv"
    p = commbench(["compare", "--fail-on-regression", "--csv", csv_path, *base, "--", *new])
    return judged(d, p, csv_path)


def ab(d: Path, run_args, a_env=(), b_env=()) -> dict:
    csv_path = d / "compare.csv"
    args = ["ab", "--rounds", "3", "--out", d / "runs", "--fail-on-regression", "--csv", csv_path]
    args += [w for kv in a_env for w in ("--a-env", kv)] + [w for kv in b_env for w in ("--b-env", kv)]
    p = commbench([*args, "--", *run_args])
    return judged(d, p, csv_path)


def controls(run_dirs) -> list[float]:
    """The cpu_loop_us of every control measurement of the runs (the host's speed beside them)."""
    out = []
    for r in run_dirs:
        try:
            meta = json.loads((Path(r) / "meta.json").read_text())
        except (OSError, ValueError):
            continue
        out += [c["cpu_loop_us"] for c in meta.get("controls") or [] if isinstance(c, dict) and "cpu_loop_us" in c]
    return out


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def trial_blocks(d: Path) -> dict:
    names = ["a1", "a2", "a3", "b1", "b2", "b3"]
    for n in names:
        run(d / n, RUN_ARGS)
    return compare(d, [d / n for n in names[:3]], [d / n for n in names[3:]])


def trial_interleaved(d: Path) -> dict:
    return ab(d, RUN_ARGS)


def trial_planted(d: Path, pct: float) -> dict:
    points = "COMMBENCH_PLANT_POINTS=" + ",".join(PLANTED)
    res = ab(d, PLANT_RUN_ARGS, a_env=[points, "COMMBENCH_PLANT_DELAY_PCT=0"],
             b_env=[points, f"COMMBENCH_PLANT_DELAY_PCT={pct:g}"])
    res["planted_found"] = sorted(set(PLANTED) & set(res["slower"]))
    res["others"] = sorted((set(res["slower"]) | set(res["faster"])) - set(PLANTED))
    return res


def trial_hog(d: Path) -> dict:
    for i in (1, 2, 3):
        run(d / f"a{i}", RUN_ARGS)
        with duty_hog():
            run(d / f"b{i}", RUN_ARGS)
    res = compare(d, [d / f"a{i}" for i in (1, 2, 3)], [d / f"b{i}" for i in (1, 2, 3)])
    res["control_us"] = {"a": round(median(controls(d / f"a{i}" for i in (1, 2, 3))), 1),
                         "b (hog)": round(median(controls(d / f"b{i}" for i in (1, 2, 3))), 1)}
    return res


def line(scenario: str, n: int, r: dict) -> str:
    extra = ""
    if scenario == "planted":
        extra = f", planted found {len(r['planted_found'])}/{len(PLANTED)}, others {len(r['others'])}"
    if scenario == "hog":
        extra = f", control cpu loop median {r['control_us']} us"
    return (f"{scenario} trial {n}: compare exit {r['exit']}, {len(r['slower'])} slower, {len(r['faster'])} faster, "
            f"{r['cannot_judge']} cannot judge of {r['points']}; host moved said: {r['host_moved']}, not "
            f"interleaved said: {r['not_interleaved']}{extra}")


def summary(scenario: str, recs: list[dict], pct: float) -> tuple[str, bool]:
    """The counts the scenario is judged by, and whether it met its target."""
    n = len(recs)
    changed = [len(r["slower"]) + len(r["faster"]) for r in recs]
    exits = {}
    for r in recs:
        exits[r["exit"]] = exits.get(r["exit"], 0) + 1
    if scenario == "blocks":
        bad = sum(c > 1 for c in changed)
        return (f"blocks: faster/slower at more than 1 point in {bad} of {n} trials (target at most {n // 10}); "
                f"exit statuses {exits}; 'not interleaved' said in {sum(r['not_interleaved'] for r in recs)}, "
                f"'host moved' in {sum(r['host_moved'] for r in recs)}", bad <= n // 10)
    if scenario == "interleaved":
        bad = sum(bool(r["slower"]) for r in recs)
        return f"interleaved same code: any slower in {bad} of {n} trials (target 0); exit statuses {exits}", bad == 0
    if scenario == "planted":
        # The gate failed because it found a planted point, not because compare could not run.
        hit = sum(r["exit"] == 1 and bool(r["planted_found"]) for r in recs)
        found = sum(len(r["planted_found"]) for r in recs)
        return (f"planted {pct:g} % on {len(PLANTED)} points, interleaved: exit 1 with a planted point found in "
                f"{hit} of {n} trials (target "
                f"at least {n - 2 * n // 20}); planted points found {found} of {len(PLANTED) * n}; others flagged "
                f"{sum(len(r['others']) for r in recs)}", hit >= n - 2 * n // 20)
    bad = sum(c > 0 for c in changed)
    said = sum(r["host_moved"] for r in recs)
    return (f"hog on the B side: any faster/slower in {bad} of {n} trials (target at most {n // 10}); the output "
            f"says the host moved in {said} of {n} (target at least {n - n // 10}); exit statuses {exits}",
            bad <= n // 10 and said >= n - n // 10)


TRIALS = {"blocks": trial_blocks, "interleaved": trial_interleaved, "planted": trial_planted, "hog": trial_hog}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in TRIALS:
        ap.add_argument(f"--{name}", action="store_true", help=f"run the {name} scenario")
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--pct", type=float, default=20.0, help="the planted slowdown, per cent")
    ap.add_argument("--out", default="results/trust-trials")
    ap.add_argument("--keep", action="store_true", help="keep the runs (default: only each trial's compare output)")
    a = ap.parse_args(argv)
    chosen = [s for s in TRIALS if getattr(a, s)]
    if not chosen or a.trials < 1 or not 0 < a.pct <= 1000:
        print("trust_trials: error: name at least one of --blocks --interleaved --planted --hog, with --trials >= 1 "
              "and 0 < --pct <= 1000", file=sys.stderr)
        return 2
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    ok = True
    for scenario in chosen:
        recs = []
        for n in range(1, a.trials + 1):
            d = out / scenario / f"trial{n:02d}"
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
            t0 = time.monotonic()
            r = TRIALS[scenario](d, a.pct) if scenario == "planted" else TRIALS[scenario](d)
            r.update(scenario=scenario, trial=n, seconds=round(time.monotonic() - t0, 1))
            recs.append(r)
            with open(out / "trials.jsonl", "a") as f:
                f.write(json.dumps(r) + "\n")
            print(line(scenario, n, r) + f" ({r['seconds']} s)", flush=True)
            if not a.keep and r["exit"] in (0, 1, 3):  # a run or compare that failed keeps its runs and logs
                for p in d.iterdir():
                    if p.is_dir():
                        shutil.rmtree(p, ignore_errors=True)
        text, met = summary(scenario, recs, a.pct)
        ok &= met
        print(("met: " if met else "MISSED: ") + text, flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
