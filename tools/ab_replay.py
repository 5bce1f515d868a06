"""The regression gate replayed on recorded runs: how compare's statistics would do on this
host's real noise, in seconds instead of the gate's 45 minutes of runs.

Given N >= 9 runs of the same code (the gate's sweep: `tools/ab_gate.py` writes such runs with
--keep, or run the sweep yourself), each draw picks three disjoint sets of three runs (A, B, P),
multiplies P's p50 at the planted points by 1 + pct/100 (every repeat), and judges
`compare A -- B` (identical code: nothing should be slower; points that cannot be judged make
the draw inconclusive, counted apart) and `compare A -- P` (the planted points should be slower,
nothing else) with compare.compare_runs, as `compare --fail-on-regression` does: the runs'
controls and rows as recorded, their order taken as interleaved, as the gate's rounds are. Draws share runs, so they are not independent rounds: this ranks
ways of judging on the same noise; the gate itself (tools/ab_gate.py) is the test that counts.

    .venv/bin/python tools/ab_replay.py RUN_DIR ... --draws 40
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from ab_gate import PLANTED  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run directories of the same code (at least 9)")
    ap.add_argument("--draws", type=int, default=40)
    ap.add_argument("--pct", type=float, default=20.0, help="the slowdown laid on the planted points, per cent")
    ap.add_argument("--planted", default=",".join(PLANTED), help="benchmark:dtype:bytes, comma-separated")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeats-upto", type=int, default=0, metavar="K",
                    help="keep only each run's repeats 1..K (what a run with --repeat K would have had)")
    a = ap.parse_args(argv)
    if len(a.runs) < 9 or a.draws < 1 or not a.pct > 0:
        print("ab_replay: error: need at least 9 runs, --draws >= 1 and --pct > 0", file=sys.stderr)
        return 2
    missing = [r for r in a.runs if not (Path(r) / "rows.jsonl").is_file()]
    if missing:
        print(f"ab_replay: error: {missing[0]}: not a run directory (no rows.jsonl)", file=sys.stderr)
        return 2
    from commbench.analyse.compare import compare_runs
    from commbench.analyse.host_moved import host_context
    from commbench.store.load import load_side
    from commbench.store.results import load_meta

    planted = {tuple(x.strip().split(":")) for x in a.planted.split(",") if x.strip()}
    frames = {r: load_side([r], "replay") for r in a.runs}
    metas = {r: load_meta(r) for r in a.runs}
    if a.repeats_upto > 0:
        frames = {r: f[f["repeat"].fillna(1) <= a.repeats_upto] if "repeat" in f else f for r, f in frames.items()}
    factor = 1.0 + a.pct / 100.0

    def side(runs, plant=False):
        import pandas as pd

        df = pd.concat([frames[r] for r in runs], ignore_index=True)
        if plant:
            hit = [(b, d, str(n)) in planted for b, d, n in zip(df["benchmark"], df["dtype"], df["nbytes"])]
            df.loc[hit, "time_us_p50"] *= factor
        return df

    def point(df):
        return set(zip(df["benchmark"], df["dtype"], df["nbytes"].astype(str)))

    def host(x, y):  # each frame names its rows' run by the directory's name (load_side)
        return host_context({Path(r).name: metas[r] for r in x}, {Path(r).name: metas[r] for r in y}, "interleaved")

    rng = random.Random(a.seed)
    same_slower = same_inconclusive = plant_exit1 = clean = every = found = 0
    for _ in range(a.draws):
        pick = rng.sample(a.runs, 9)
        same = compare_runs(side(pick[:3]), side(pick[3:6]), host=host(pick[:3], pick[3:6]))
        plant = compare_runs(side(pick[:3]), side(pick[6:], plant=True), host=host(pick[:3], pick[6:]))
        same_slower += bool((same["verdict"] == "slower").any())
        same_inconclusive += bool((same["verdict"] == "slower").sum() == 0 and (same["verdict"] == "cannot judge").any())
        flagged = point(plant[plant["verdict"].isin(["slower", "faster"])])
        hit, others = len(flagged & planted), len(flagged - planted)
        exit1 = bool((plant["verdict"] == "slower").any())
        plant_exit1 += exit1
        clean += exit1 and others <= 1
        every += exit1 and others <= 1 and hit == len(planted)
        found += hit
    n = a.draws
    print(f"{n} draws of 3 runs a side from {len(a.runs)} runs: identical code called slower in {same_slower}, "
          f"nothing slower in {n - same_slower} ({same_inconclusive} of them inconclusive); "
          f"{a.pct:g} % on {len(planted)} points: exit 1 in {plant_exit1}, with at most 1 other point flagged in "
          f"{clean}, every planted point flagged too in {every}; planted points found {found} of {len(planted) * n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
