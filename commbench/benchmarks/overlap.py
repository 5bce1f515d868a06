"""All-reduce overlapped with compute: how much of a gradient all-reduce really hides
behind a matrix multiply, and what it costs the multiply (OSU's osu_iallreduce, IMB-NBC).

Per point (bucket size S = the point's nbytes, compute shape, backend), four timings, each
through the harness (warm-up, iteration count agreed across ranks, slowest rank per
iteration, a barrier between iterations outside the timed window as OSU's NBC tests do):

  t_comm            start + wait of the non-blocking all_reduce alone (sequence mode: the
                    `buckets` buckets one after another, i.e. the SUM of the pure times)
  t_compute         the compute alone: C = A @ B, M = N = K = gemm_n, float32, run in the
                    same row blocks as in the overlapped run
  t_overall         start the all_reduce(s), run the compute, wait: the row's time_us_*
  t_compute_during  the compute's own time inside t_overall

and from their p50s: overlap % by OSU's formula and by IMB-NBC's, compute slowdown, exposed
communication, GFLOP/s alone and overlapped (2 M N K flops a multiply). A row whose
calibration missed its target, or whose figures cannot be physically right (row_warnings),
carries a `warning`.

Modes: `single`, one bucket started before the compute; `sequence`, `buckets` buckets
issued as the compute proceeds (DDP's backward: compute in `buckets` chunks, bucket i
started after chunk i, all waited at the end), so the last bucket is exposed by design.

Progress: MPI's shared-memory and TCP paths advance a non-blocking collective only inside
MPI calls. `polls` spreads that many test() calls over the compute (OSU's -t); with
`progress=thread` a Python thread calls test() in a loop until the operation completes.
That thread costs a core (Open MPI binds a rank to one: the thread and the compute then
share it) and the GIL (it holds it between calls; the switch interval is lowered to 50 us
while it runs so the compute thread gets it back at chunk boundaries). gloo runs
collectives on its own threads and NCCL on its own CUDA stream: they need neither.

The measurement core (OverlapCore) takes a communicator and a compute object, so the
tests drive it with a fake communicator of known duration; the formulas are pure functions.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from commbench.backends.compute import Compute, Gemm, calibrate_gemm, set_compute_threads
from commbench.core.errors import UsageError

from .base import Benchmark, Param, Point, Traffic, equal_chunked, fill_chunked, pattern_run, register
from .overlap_core import OverlapCore, Schedule, make_schedule, nchunks_for  # noqa: F401 (the core's names, here too)

MODES = ("single", "sequence")
PROGRESS = ("none", "thread")
COMPUTES = ("auto", "numpy", "torch")
MIN_GEMM = 8
MAX_GEMM = {"cpu": 4096, "cuda": 16384}
PROVISIONAL_GEMM = 64          # the --check run before calibration
# A calibrated row whose t_compute ends more than this factor away from t_comm (its target)
# carries a warning: calibration stops within 10 % (CALIBRATE_TOL) and the timed loop is a
# p50 of the same compute, so on a quiet host they agree within ~10 %; by 1.5x the OSU and
# IMB figures part (IMB divides by the longer time) and the row no longer measures what
# the suite meant. A miss this large first gets up to RECALIBRATIONS more tries, each
# sized from the timed loop's own p50 (a longer window than the calibration's).
CALIBRATION_WARN_FACTOR = 1.5
RECALIBRATIONS = 2
# "Beyond noise" for the figures that cannot be what they say: a compute that ran more
# than 20 % faster beside the all_reduce than alone, an overlapped run shorter than its
# compute by over 20 % of it, or one longer than the compute as it ran plus the whole
# pure all_reduce by over 20 %. Two p50s of one compute on a quiet host differ by a few %;
# 20 % is what a core shared with other work moves them by, and is flagged.
NOISE_FRAC = 0.20


# --- the formulas (pure) ---------------------------------------------------------------

def overlap_osu_pct(t_pure: float, t_compute: float, t_overall: float) -> float:
    """OSU: max(0, 100 - 100 (t_overall - t_compute) / t_pure), here also capped at 100
    (an overall run faster than the compute alone is noise, not more than full overlap)."""
    if t_pure <= 0:
        return 0.0
    return float(min(100.0, max(0.0, 100.0 - 100.0 * (t_overall - t_compute) / t_pure)))


def overlap_imb_pct(t_pure: float, t_compute: float, t_overall: float) -> float:
    """IMB-NBC: 100 max(0, min(1, (t_pure + t_compute - t_overall) / max(t_pure, t_compute)))."""
    denom = max(t_pure, t_compute)
    if denom <= 0:
        return 0.0
    return float(100.0 * max(0.0, min(1.0, (t_pure + t_compute - t_overall) / denom)))


def overlap_fields(t_comm_us: float, t_compute_us: float, t_overall_us: float, t_during_us: float,
                   flops: float) -> dict:
    """Every derived figure of a row, from the four p50s (microseconds)."""
    return {
        "t_comm_us": t_comm_us, "t_compute_us": t_compute_us, "t_overall_us": t_overall_us,
        "t_compute_during_us": t_during_us,
        "overlap_osu_pct": overlap_osu_pct(t_comm_us, t_compute_us, t_overall_us),
        "overlap_imb_pct": overlap_imb_pct(t_comm_us, t_compute_us, t_overall_us),
        "compute_slowdown": t_during_us / t_compute_us if t_compute_us > 0 else float("nan"),
        "exposed_us": t_overall_us - t_compute_us,
        "exposed_pct": 100.0 * (t_overall_us - t_compute_us) / t_comm_us if t_comm_us > 0 else float("nan"),
        "gflops_alone": flops / (t_compute_us * 1e-6) / 1e9 if t_compute_us > 0 else 0.0,
        "gflops_overlapped": flops / (t_during_us * 1e-6) / 1e9 if t_during_us > 0 else 0.0,
    }


def _us_txt(v: float) -> str:
    return f"{v:.0f} us" if abs(v) >= 10 else f"{v:.3g} us"


def row_warnings(f: dict, calibrated: bool, gemm_note: str = "") -> list[str]:
    """Why a row's figures cannot be taken as they stand, from its four p50s (the fields of
    overlap_fields): a calibration that missed its target (t_compute ~ t_comm), and figures
    that are physically odd beyond noise (NOISE_FRAC). gemm_note says what the calibration
    ran into (its size limit, the recalibrations it took). Empty: nothing to warn of."""
    t_comm, t_comp = f["t_comm_us"], f["t_compute_us"]
    t_all, t_during = f["t_overall_us"], f["t_compute_during_us"]
    out = []
    if calibrated and t_comm > 0 and t_comp > 0:
        r = t_comp / t_comm
        if not 1 / CALIBRATION_WARN_FACTOR <= r <= CALIBRATION_WARN_FACTOR:
            out.append(f"calibration missed: t_compute {_us_txt(t_comp)} = {r:.2g}x its target t_comm "
                       f"{_us_txt(t_comm)} (allowed {1 / CALIBRATION_WARN_FACTOR:.2g}-{CALIBRATION_WARN_FACTOR:g}x"
                       + (f"; {gemm_note}" if gemm_note else "") + "): OSU and IMB % not comparable")
    slow = f.get("compute_slowdown")
    if slow is not None and slow == slow and slow < 1 - NOISE_FRAC:
        out.append(f"compute slowdown {slow:.2f}x: the multiply ran faster beside the all_reduce than alone "
                   f"(the two timings saw different load)")
    if t_comp > 0 and t_all < t_comp * (1 - NOISE_FRAC):
        out.append(f"t_overall {_us_txt(t_all)} < t_compute {_us_txt(t_comp)}: shorter than its own compute "
                   f"(OSU % capped at 100)")
    if t_comm > 0 and t_all > (t_during + t_comm) * (1 + NOISE_FRAC):
        out.append(f"t_overall {_us_txt(t_all)} = {t_all / (t_during + t_comm):.2g}x the compute as it ran plus "
                   f"t_comm ({_us_txt(t_during + t_comm)}): the wait outlasted the all_reduce alone "
                   f"(OSU % clamped at 0)")
    return out


# --- the benchmark -----------------------------------------------------------------------

@dataclass
class OverlapBufs:
    point: Point
    sends: list
    recvs: list
    count: int
    schedule: Schedule
    compute_lib: str              # numpy | torch
    device: str                   # cpu | cuda
    compute: Compute
    core: OverlapCore | None = None
    restore_threads: Callable[[], None] = lambda: None
    threads_how: str = ""
    calibrated: bool = False


def _agree_max(comm) -> Callable[[float], float]:
    return lambda t: float(comm.max_over_ranks(np.array([t]))[0])


@register
class Overlap(Benchmark):
    """Non-blocking all_reduce overlapped with a matrix multiply: overlap %, compute slowdown."""

    name = "overlap"
    params = {
        "mode": Param("single", "single: one bucket before the compute; sequence: `buckets` buckets started "
                      "as the compute proceeds (DDP backward)", str, choices=MODES),
        "buckets": Param(8, "sequence: buckets per iteration (each the point's size)", int, minimum=1),
        "gemm": Param(0, "matrix multiply M=N=K; 0: calibrate so t_compute ~ t_comm (OSU)", int, minimum=0),
        "polls": Param(0, "test() calls spread over the compute (OSU -t); 0: none", int, minimum=0),
        "progress": Param("none", "thread: a Python thread calls test() in a loop until done (costs a core and the GIL)", str,
                          choices=PROGRESS),
        "compute": Param("auto", "matmul library: auto (numpy on mpi, torch on gloo/nccl), numpy, torch", str,
                         choices=COMPUTES),
        "threads": Param(1, "compute threads (OpenBLAS / torch intra-op; CPU only)", int, minimum=1),
    }

    def refusal(self, backend: str, device: str, params: dict) -> str | None:
        if backend == "jax":  # XLA schedules a program's collectives itself: none is started by hand
            return ("overlap starts non-blocking all_reduces by hand and polls them during the compute; a JAX "
                    "program leaves that scheduling to XLA: run overlap on mpi, gloo or nccl")
        return None

    # --- presentation: the table, figure and report section are the report layer's view
    # "overlap" (report/overlap_view.py) ---
    view = "overlap"
    collective_rows = False  # a row's time is start + compute + wait, not one collective's

    def canonical_params(self, params):
        p = dict(params)
        if p["mode"] == "single":
            p["buckets"] = self.params["buckets"].default
        if p["progress"] == "thread":  # two threads testing one request is erroneous in MPI
            p["polls"] = 0
        return p

    def _buckets(self, params) -> int:
        return params["buckets"] if params["mode"] == "sequence" else 1

    def memory_nbytes(self, point):
        n = point.params["gemm"] or 1024
        return 2 * self._buckets(point.params) * point.nbytes + 3 * 4 * n * n

    def plan_nbytes(self, point):
        return int(self._buckets(point.params) * point.nbytes * 2 * 2)

    stages = 3  # comm, compute, overall: three timed loops (one row)

    def validate(self, point):
        p = point.params
        n = nchunks_for(p)  # refuses a one-bucket sequence
        if p["gemm"] and p["gemm"] < n:
            raise UsageError(f"overlap: gemm {p['gemm']} has fewer rows than the {n} compute chunks "
                             f"(mode {p['mode']}, buckets {p['buckets']}, polls {p['polls']})")

    def busbw_factor(self, world):
        # S = one bucket, F = 2(n-1)/n: the pure all_reduce's busbw, as all_reduce's.
        return 2 * (world - 1) / world

    # --- setup --------------------------------------------------------------------------
    @staticmethod
    def compute_choice(backend: str, device: str, compute: str) -> tuple[str, str]:
        """(lib, device) of the matmul: numpy on mpi (no torch import: ~1 s start-up),
        torch on gloo (CPU) and nccl (CUDA)."""
        if device == "cuda":
            if backend != "nccl" or compute == "numpy":
                raise UsageError("overlap on CUDA buffers runs on the nccl backend with a torch matmul")
            return "torch", "cuda"
        if compute == "auto":
            return ("numpy" if backend == "mpi" else "torch"), "cpu"
        return compute, "cpu"

    def make_compute(self, b: OverlapBufs, n: int) -> Compute:
        return Gemm(n, b.schedule.nchunks, b.compute_lib, b.device)

    def setup(self, comm, point):
        p = point.params
        lib, device = self.compute_choice(comm.backend, comm.device, p["compute"])
        if p["progress"] == "thread" and comm.backend == "mpi":
            MPI = comm.MPI
            if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
                raise UsageError("overlap: progress=thread needs MPI_THREAD_MULTIPLE, which this MPI did not grant")
        sched = make_schedule(p["mode"], self._buckets(p), p["polls"])
        count = point.nbytes // point.elem_nbytes
        sends = [comm.alloc(count, point.dtype) for _ in range(sched.buckets)]
        recvs = [comm.alloc(count, point.dtype) for _ in range(sched.buckets)]
        b = OverlapBufs(point, sends, recvs, count, sched, lib, device, Compute())
        n0 = p["gemm"] or max(PROVISIONAL_GEMM, sched.nchunks)
        b.compute = self.make_compute(b, n0)
        b.restore_threads, b.threads_how = set_compute_threads(b.compute.name, p["threads"])
        b.core = OverlapCore(comm, b.compute, sends, recvs, sched, p["progress"])
        return b

    def _at(self, point, rank, bucket):
        return lambda lo, hi: pattern_run(lo, hi - lo, rank, point.dtype, point.world, True, salt=bucket)

    def fill(self, comm, b):
        # recv starts as a copy of the input: torch reduces in place (as AllReduce does).
        for i, (s, r) in enumerate(zip(b.sends, b.recvs)):
            fill_chunked(comm, s, b.count, self._at(b.point, comm.rank, i))
            fill_chunked(comm, r, b.count, self._at(b.point, comm.rank, i))
        b.compute.reset()

    def op(self, comm, b):
        """One overlapped iteration (what --check verifies)."""
        return b.core.overlapped_once

    def check(self, comm, b):
        if not b.compute.check():
            return False
        world = comm.size
        for i, r in enumerate(b.recvs):
            parts = [self._at(b.point, q, i) for q in range(world)]
            if not equal_chunked(comm, r, b.count, lambda lo, hi: sum(f(lo, hi) for f in parts)):
                return False
        return True

    # --- measurement ----------------------------------------------------------------------
    def measure(self, harness, comm, point, b):
        try:
            return [self.measure_core(harness, comm, point, b)]
        finally:
            b.core.close()
            b.restore_threads()

    def measure_core(self, harness, comm, point, b) -> dict:
        """The three timed loops through the harness, calibration between the first two,
        and the row. Tests call it with a fake comm and compute."""
        p, core = point.params, b.core
        clock = time.perf_counter
        sched = b.schedule
        comm_traffic = Traffic(point.nbytes * sched.buckets, self.busbw_factor(point.world))
        # OSU's NBC tests: a barrier between iterations, outside the timed window.
        t_setup = clock()
        # On a GPU each step is enqueued behind a stream hold: starts, waits and polls never
        # block the host there (a NCCL wait orders the stream; a test queries it).
        f_comm, _ = harness.time_steps(comm, point, core.comm_once, comm_traffic, stage="comm", barrier_each=True,
                                       hold=True)
        t_comm_s = f_comm["time_us_p50"] * 1e-6
        lo, hi = max(MIN_GEMM, sched.nchunks), MAX_GEMM[b.device]
        if not p["gemm"]:
            harness.arm("gemm calibration")

            def time_runs(comp, n):
                # Timed as the compute stage times it: every rank at once, a barrier between
                # runs, the slowest rank's time per run, so the calibration aims at the figure
                # that stage reports (ranks timing their own runs back to back drift apart, and
                # the largest of their medians is not the median of the slowest rank's runs).
                # The times come back the same on every rank, so every rank runs the same
                # count, which the barrier needs.
                ts, _ = comm.time_steps(lambda lap: comp.run(), n, 0, barrier_each=True)
                return comm.max_over_ranks(ts)
            b.compute = calibrate_gemm(t_comm_s, lambda n: self.make_compute(b, n), _agree_max(comm),
                                       lo=lo, hi=hi, n0=b.compute.n if b.compute.n else PROVISIONAL_GEMM,
                                       time_runs=time_runs)
            b.calibrated = True
            core.set_compute(b.compute)
        calib_s = clock() - t_setup

        def time_compute():
            return harness.time_steps(comm, point, core.compute_once, comm_traffic, stage="compute",
                                      barrier_each=True, hold=True)[0]
        f_comp = time_compute()
        recalibrations = 0
        if b.calibrated:
            # The calibration's windows are short (about 50 ms a size); when the timed loop
            # then finds the compute off its target by more than the warning factor, size it
            # again from that loop's p50 (the same figure on every rank, so every rank takes
            # the same steps) and keep whichever try came closest.
            def miss(f):  # how far off, as |log ratio|; no target or no time: nothing to correct
                t, target = f["time_us_p50"], f_comm["time_us_p50"]
                return abs(float(np.log(t / target))) if t > 0 and target > 0 else 0.0
            best = (miss(f_comp), b.compute, f_comp)
            while recalibrations < RECALIBRATIONS and best[0] > np.log(CALIBRATION_WARN_FACTOR):
                n = b.compute.n
                ratio = f_comm["time_us_p50"] / f_comp["time_us_p50"]
                nxt = int(min(max(round(n * ratio ** (1 / 3)), lo), hi))
                if nxt == n:  # at a size limit: another try would time the same multiply
                    break
                recalibrations += 1
                harness.arm("gemm recalibration")
                b.compute = self.make_compute(b, nxt)
                b.compute.run()  # untimed: first touch, BLAS buffers
                core.set_compute(b.compute)
                f_comp = time_compute()
                if miss(f_comp) < best[0]:
                    best = (miss(f_comp), b.compute, f_comp)
            _, b.compute, f_comp = best
            core.set_compute(b.compute)
        tests: list = []

        def after_each(i):  # the progress thread's test() calls, outside the timing
            if i == 0:
                tests.clear()
            tests.append(core.thread_tests)

        b.compute.reset()
        f_all, laps_s = harness.time_steps(comm, point, core.overlapped_once, comm_traffic, stage="overall",
                                           laps=core.OVERLAPPED_LAPS, barrier_each=True, after_each=after_each,
                                           hold=True)
        t_during = laps_s[:, 1] * 1e6
        for name in core.OVERLAPPED_LAPS:  # in t_compute_during_us below
            f_all.pop(f"stage_us_{name}")
        figs = overlap_fields(f_comm["time_us_p50"], f_comp["time_us_p50"], f_all["time_us_p50"],
                              float(np.median(t_during)), b.compute.flops)
        row = {**f_all, "stage": "", "timing": "barrier",
               # bandwidth of the pure all_reduce: S = one bucket, F = 2(n-1)/n
               "algbw_gbps": f_comm["algbw_gbps"], "busbw_gbps": f_comm["busbw_gbps"],
               "busbw_factor": f_comm["busbw_factor"],
               **figs,
               "t_comm_bucket_us": f_comm["time_us_p50"] / sched.buckets,
               "t_comm_p99_us": f_comm["time_us_p99"], "t_compute_p99_us": f_comp["time_us_p99"],
               "t_compute_during_p99_us": float(np.percentile(t_during, 99)),
               "comm_iters": f_comm["iters"], "compute_iters": f_comp["iters"],
               "compute_backend": b.compute.name, "compute_threads": p["threads"] if b.device == "cpu" else None,
               "compute_threads_set_by": b.threads_how,
               "gemm_n": b.compute.n, "gemm_calibrated": b.calibrated, "gemm_chunks": sched.nchunks,
               "calibration_s": calib_s, "gemm_recalibrations": recalibrations,
               "mode": p["mode"], "buckets": sched.buckets, "polls": p["polls"], "progress": p["progress"],
               # progress=thread: the thread's test() calls per overlapped iteration (rank 0's median)
               "thread_tests_per_iter": float(np.median(tests)) if p["progress"] == "thread" else 0.0,
               "bandwidth_note": "algbw/busbw: the pure all_reduce (t_comm per bucket, S = bucket, "
                                 "F = 2(n-1)/n); time_us_*: t_overall"}
        limit = {lo: "the smallest", hi: "the largest"}.get(b.compute.n)
        note = ", ".join(x for x in (
            f"gemm n {b.compute.n} is {limit} this device allows" if b.calibrated and limit else "",
            f"after {recalibrations} recalibration(s)" if recalibrations else "") if x)
        # A stage's own warning (a device stream hold that did not cover a batch) stays
        # beside the row's.
        warnings = [w for w in (f_comm.get("warning"), f_comp.get("warning"), f_all.get("warning")) if w]
        warnings += row_warnings(figs, b.calibrated, note)
        if warnings:
            row["warning"] = "; ".join(dict.fromkeys(warnings))
        else:
            row.pop("warning", None)
        if harness.check:
            ok = b.compute.check()
            if comm.min_over_ranks(np.array([1.0 if ok else 0.0]))[0] <= 0:
                row["check"] = "fail"
        return row

