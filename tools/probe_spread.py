"""How far the loopback's memcpy probe spreads on this host, quiet and beside a CPU hog: the
evidence for ceilings.PROBE_SPREAD_PCT (a probe beyond it carries no line-rate verdict).

    python tools/probe_spread.py --trials 8          # quiet host
    python tools/probe_spread.py --trials 8 --hog    # beside one busy loop per core

Each trial is one probe as a run takes it (probe.memcpy_samples_gbps at the in-cache and the
beyond-cache size); printed per size: the trials' spread (min / median / max), the probe's
run-queue wait, and how many trials ceilings.probe_doubt would refuse.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

from commbench.analyse.ceilings import PROBE_SPREAD_PCT, probe_doubt
from commbench.backends import probe
from commbench.core import hoststate


def _spin(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


def trial(where: str, nbytes: int) -> dict:
    w0, t0 = hoststate.wait_ns(), time.monotonic()
    runs = probe.memcpy_samples_gbps(nbytes)
    wall = time.monotonic() - t0
    wait = 100.0 * (hoststate.wait_ns() - w0) / 1e9 / wall if w0 is not None else 0.0
    return {f"memcpy_{where}_spread_pct": probe.spread_pct(runs), f"memcpy_{where}_wait_pct": wait,
            "median": statistics.median(runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--hog", action="store_true", help="one busy loop per core while probing")
    a = ap.parse_args()
    llc = probe.llc_nbytes()
    sizes = {"in_cache": min(llc // 4, probe.IN_CACHE_MAX_NBYTES),
             "beyond_cache": min(max(4 * llc, probe.BEYOND_CACHE_MIN_NBYTES), probe.BEYOND_CACHE_MAX_NBYTES)}
    hogs = []
    if a.hog:
        stop = time.monotonic() + 3600
        hogs = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(hoststate.cores())]
        for h in hogs:
            h.start()
    try:
        for where, nbytes in sizes.items():
            got = [trial(where, nbytes) for _ in range(a.trials)]
            spread = sorted(g[f"memcpy_{where}_spread_pct"] for g in got)
            wait = [g[f"memcpy_{where}_wait_pct"] for g in got]
            refused = sum(bool(probe_doubt(g, where)) for g in got)
            print(f"{where} ({nbytes >> 20} MiB){' beside a hog' if a.hog else ''}: {a.trials} trials, spread "
                  f"{spread[0]:.1f} / {statistics.median(spread):.1f} / {spread[-1]:.1f} % (min / median / max), "
                  f"wait up to {max(wait):.0f} %, median rate {statistics.median(g['median'] for g in got):.2f} GB/s; "
                  f"{refused} of {a.trials} refused (spread > {PROBE_SPREAD_PCT:g} % or wait > "
                  f"{hoststate.WAIT_PCT:g} %)")
    finally:
        for h in hogs:
            h.terminate()


if __name__ == "__main__":
    main()
