"""The loopback's ceiling, measured at the start of a run: on one host the "link" between
CPU ranks is shared memory, so no fixed figure fits; a single-copy transport cannot beat
one core's memcpy point to point, and no operation beats the library's 0-byte latency."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from commbench.backends.mpi import aligned_empty
from commbench.core import hoststate

FALLBACK_LLC_NBYTES = 32 << 20
# The beyond-cache probe copies 4 x the LLC, within these bounds. Why a cap: a VM sees its
# host's whole last-level cache in sysfs (480 MiB on a 2-core guest of a large Xeon), and
# 4 x that is two 1.9 GiB buffers and 8 s of copying at the start of every run, while one core
# copies at the same rate from 256 MiB up there; a copy of 256 MiB streams 512 MiB through the
# cache, beyond what one core of any current part holds.
BEYOND_CACHE_MIN_NBYTES = 64 << 20
# The in-cache probe copies LLC / 4, at most this: what one core of a VM's large shared L3 holds.
IN_CACHE_MAX_NBYTES = 8 << 20
BEYOND_CACHE_MAX_NBYTES = 256 << 20


def _size_text(text: str) -> int:
    text = text.strip().upper()
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * mult


def llc_nbytes(sysfs: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """Size of the last-level cache from sysfs (the highest level listed)."""
    best = (0, 0)
    for d in Path(sysfs).glob("index*"):
        try:
            level = int((d / "level").read_text())
            size = _size_text((d / "size").read_text())
        except (OSError, ValueError):
            continue
        best = max(best, (level, size))
    return best[1] or FALLBACK_LLC_NBYTES


# Probes of each memcpy rate: the ceiling is their median, and their spread is recorded. One
# probe (or the best of a few) moved 3x between runs on a shared host, so "% of line rate"
# did not compare between runs; a median of several moves far less, and the spread says how much.
PROBES = 5


def memcpy_samples_gbps(nbytes: int, min_time_s: float = 0.05, repeats: int = PROBES) -> list[float]:
    """One core's copy rate in bytes copied per second (GB/s), `repeats` timings of
    back-to-back copies each: the figure a single-copy transport is bounded by. (A STREAM
    copy figure counts read + write, twice this.)"""

    n = max(int(nbytes), 4096)
    src, dst = aligned_empty(n, np.uint8), aligned_empty(n, np.uint8)
    src[:] = 1
    dst[:] = 0  # first touch outside the timing
    np.copyto(dst, src)
    per = time.perf_counter()
    np.copyto(dst, src)
    per = max(time.perf_counter() - per, 1e-7)
    reps = max(1, int(min_time_s / per))
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(reps):
            np.copyto(dst, src)
        out.append(n * reps / (time.perf_counter() - t0) / 1e9)
    return out


def memcpy_gbps(nbytes: int, min_time_s: float = 0.05, repeats: int = PROBES) -> float:
    """The median of memcpy_samples_gbps."""
    return float(np.median(memcpy_samples_gbps(nbytes, min_time_s, repeats)))


def spread_pct(samples) -> float:
    """(max - min) / median of a probe's samples, per cent."""
    v = np.asarray(samples, dtype=float)
    return float((v.max() - v.min()) / np.median(v) * 100.0) if v.size and np.median(v) > 0 else float("nan")


class _ProbeWatch:
    """The probe's own disturbance, as a point's (core/hoststate): the share of its wall time
    this thread waited on a run queue, and the host's CPU steal over it. A probe that waited
    timed the scheduler, not the copy (ceilings.probe_doubt)."""

    def __init__(self):
        self.wait, self.ticks, self.wall = hoststate.wait_ns(), hoststate.cpu_ticks(), time.monotonic()

    def shares(self) -> dict:
        wall = max(time.monotonic() - self.wall, 1e-9)
        w1 = hoststate.wait_ns()
        steal = hoststate.tick_shares(self.ticks, hoststate.cpu_ticks())
        return {"wait_pct": 100.0 * (w1 - self.wait) / 1e9 / wall if w1 is not None and self.wait is not None
                else None,
                "steal_pct": steal["steal_pct"] if steal["steal_ticks"] >= hoststate.MIN_TICKS else 0.0}


def latency_us(comm, iters: int = 2000) -> float | None:
    """p50 of a 0-byte exchange (Sendrecv) between ranks 0 and 1: the library's latency
    floor, osu_latency's one-way figure. Other ranks wait without spinning."""
    if comm.size < 2:
        return None
    if comm.rank > 1:
        comm.idle_barrier()
        return None
    nbytes = 0 if comm.backend == "mpi" else 1  # gloo cannot send an empty tensor
    send, recv = comm.alloc(max(nbytes, 1), "uint8"), comm.alloc(max(nbytes, 1), "uint8")
    if nbytes == 0:
        send, recv = send[:0], recv[:0]
    op = comm.send_recv(send, recv, 1 - comm.rank)
    comm.time_ops(op, 100)
    t = float(np.median(comm.time_ops(op, iters))) * 1e6
    comm.idle_barrier()
    return t


def loopback_probe(comm) -> dict:
    """Collective over `comm`: rank 0 times memcpy inside and beyond the LLC while the
    others wait; ranks 0 and 1 time the latency. Every rank gets the same dict."""
    llc = llc_nbytes()
    res = {"llc_nbytes": llc}
    if comm.rank == 0:
        res["memcpy_in_cache_nbytes"] = min(llc // 4, IN_CACHE_MAX_NBYTES)
        res["memcpy_beyond_cache_nbytes"] = min(max(4 * llc, BEYOND_CACHE_MIN_NBYTES), BEYOND_CACHE_MAX_NBYTES)
        for where in ("in_cache", "beyond_cache"):
            watch = _ProbeWatch()
            runs = memcpy_samples_gbps(res[f"memcpy_{where}_nbytes"])
            res[f"memcpy_{where}_gbps"] = float(np.median(runs))
            res[f"memcpy_{where}_runs_gbps"] = runs
            res[f"memcpy_{where}_spread_pct"] = spread_pct(runs)
            res.update({f"memcpy_{where}_{k}": v for k, v in watch.shares().items()})
        res["memcpy_basis"] = f"median of {PROBES} probes; spread = (max - min) / median"
    comm.idle_barrier()
    lat = latency_us(comm)
    res["latency_us"] = lat
    res["latency_nbytes"] = 0 if comm.backend == "mpi" else 1
    res["latency_method"] = "p50 of a Sendrecv exchange between ranks 0 and 1"
    return dict(comm.allgather_obj(res)[0])
