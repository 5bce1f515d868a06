"""The overlap benchmark: the formulas, the schedule, the measurement core against fake
communicators of known duration, and real ranks (mpi, gloo) through the CLI.

Fake timings: D (all_reduce) and C (compute) are 20 ms sleeps. A sleep overshoots by
~0.05-0.1 ms (timer slack), starting the fake's progress thread costs ~0.1 ms, and a loaded
2-core host delays a wake-up by a few tenths of a ms now and then; each figure is a p50 of
8 iterations, so single late wake-ups drop out. That is < 1 ms of 20 ms (5 %): the
tolerance of 15 percentage points (3 ms) leaves three times that.
"""
from __future__ import annotations

import io
import threading
import time

import numpy as np
import pytest

from commbench.backends.base import Comm, Handle
from commbench.backends.compute import Compute, Gemm, calibrate_gemm, gemm_flops
from commbench.benchmarks.base import Point
from commbench.benchmarks.overlap import (
    Overlap,
    OverlapCore,
    make_schedule,
    overlap_fields,
    overlap_imb_pct,
    overlap_osu_pct,
    row_warnings,
)
from commbench.report import views
from commbench.run.point_harness import Harness
from commbench.run.suite import SuiteConfig, build_config, expand, read_suite
from conftest import needs_mpi, needs_torch, run_cli

D = 0.020
C = 0.020
TOL = 15.0  # percentage points; see the module docstring


# --- formulas -------------------------------------------------------------------------------

@pytest.mark.parametrize("t_overall,osu,imb", [(12, 80, 80), (20, 0, 0), (10, 100, 100), (15, 50, 50),
                                               (25, 0, 0), (9, 100, 100)])
def test_formulas_equal_compute_and_comm(t_overall, osu, imb):
    assert overlap_osu_pct(10, 10, t_overall) == pytest.approx(osu)
    assert overlap_imb_pct(10, 10, t_overall) == pytest.approx(imb)


def test_formulas_unequal_times():
    # comm 10, compute 5, overall 12: OSU 100 - 100*7/10 = 30; IMB (15-12)/10 = 30
    assert overlap_osu_pct(10, 5, 12) == pytest.approx(30)
    assert overlap_imb_pct(10, 5, 12) == pytest.approx(30)
    # comm 4, compute 10, overall 11: OSU 100 - 100*1/4 = 75; IMB (14-11)/10 = 30 (IMB divides by the longer)
    assert overlap_osu_pct(4, 10, 11) == pytest.approx(75)
    assert overlap_imb_pct(4, 10, 11) == pytest.approx(30)
    # comm 4 fully hidden behind compute 10: OSU 100 (of the comm); IMB (14-10)/10 = 40 (of the longer)
    assert overlap_osu_pct(4, 10, 10) == pytest.approx(100)
    assert overlap_imb_pct(4, 10, 10) == pytest.approx(40)
    assert overlap_osu_pct(0, 10, 10) == 0.0 and overlap_imb_pct(0, 0, 1) == 0.0


def test_overlap_fields():
    f = overlap_fields(10.0, 10.0, 12.0, 11.0, gemm_flops(100))
    assert f["overlap_osu_pct"] == pytest.approx(80) and f["overlap_imb_pct"] == pytest.approx(80)
    assert f["exposed_us"] == pytest.approx(2.0) and f["exposed_pct"] == pytest.approx(20.0)
    assert f["compute_slowdown"] == pytest.approx(1.1)
    assert f["gflops_alone"] == pytest.approx(2e6 / 10e-6 / 1e9)
    assert f["gflops_overlapped"] == pytest.approx(2e6 / 11e-6 / 1e9)


def test_schedule():
    s = make_schedule("single", 1, 0)
    assert (s.nchunks, s.start_after, s.poll_after) == (1, (-1,), frozenset())
    s = make_schedule("single", 1, 8)
    assert s.nchunks == 9 and s.poll_after == frozenset(range(8))
    s = make_schedule("sequence", 8, 0)
    assert s.nchunks == 8 and s.start_after == tuple(range(8)) and not s.poll_after
    for buckets, polls in ((8, 8), (4, 10), (2, 1), (3, 7)):
        s = make_schedule("sequence", buckets, polls)
        assert len(s.poll_after) == polls and s.buckets == buckets
        # every poll falls after the first start and before the last chunk
        assert min(s.poll_after) >= s.start_after[0] and max(s.poll_after) < s.nchunks - 1
        assert s.start_after[-1] == s.nchunks - 1
    with pytest.raises(Exception, match="buckets >= 2"):
        make_schedule("sequence", 1, 0)


# --- fakes ----------------------------------------------------------------------------------

class FakeComm(Comm):
    """World 1, in process. kind:
    async      the all_reduce progresses in a background thread: done (result copied) D
               after its start;
    wait_only  nothing happens until wait(), which then takes D (a library without
               asynchronous progress, never polled);
    steps      `steps` steps of D/steps; a step, once kicked, proceeds on its own, but only a
               test() or wait() kicks the next one (MPI's progress inside library calls)."""

    backend = "fake"

    def __init__(self, kind: str, duration: float = D, steps: int = 4, corrupt: bool = False):
        super().__init__(0, 1)
        self.kind, self.duration, self.steps, self.corrupt = kind, duration, steps, corrupt
        self.tests = 0

    def alloc(self, count, dtype):
        return np.zeros(count, dtype=np.float32)

    def fill(self, buf, values):
        buf[...] = values

    def to_numpy(self, buf):
        return np.asarray(buf, dtype=np.float64)

    def host_view(self, buf):
        return buf

    def barrier_op(self):
        return lambda: None

    def max_over_ranks(self, values):
        return np.array(values, dtype=np.float64)

    def allgather_obj(self, obj):
        return [obj]

    def _result(self, send, recv):
        recv[...] = send  # world 1: the sum is the input
        if self.corrupt:
            recv[0] = 12345.0

    def iall_reduce(self, send, recv):
        d = self.duration
        if self.kind == "async":
            done = threading.Event()
            self._worker().put((time.perf_counter() + d, send, recv, done))
            return Handle(done.wait, done.is_set)
        if self.kind == "wait_only":
            def wait():
                time.sleep(d)
                self._result(send, recv)
            return Handle(wait, lambda: False)
        return self._steps_handle(send, recv)

    def _worker(self):
        """One background thread completes every started all_reduce D after its start (a
        FIFO: every job lasts D, so deadlines come in start order)."""
        if getattr(self, "_jobs", None) is None:
            import queue

            self._jobs = queue.Queue()

            def run():
                while True:
                    deadline, send, recv, done = self._jobs.get()
                    time.sleep(max(0.0, deadline - time.perf_counter()))
                    self._result(send, recv)
                    done.set()
            threading.Thread(target=run, daemon=True).start()
        return self._jobs

    def _steps_handle(self, send, recv):
        step = self.duration / self.steps
        st = {"done": 0, "end": time.perf_counter() + step}

        def test():
            self.tests += 1
            now = time.perf_counter()
            if st["done"] < self.steps and now >= st["end"]:
                st["done"] += 1
                if st["done"] < self.steps:
                    st["end"] = now + step
                else:
                    self._result(send, recv)
            return st["done"] == self.steps

        def wait():
            while not test():
                time.sleep(max(0.0, st["end"] - time.perf_counter()))
        return Handle(wait, test)


class SleepCompute(Compute):
    """A compute of known total duration, in the schedule's chunks (sleeps release the GIL,
    as BLAS does)."""

    name = "sleep"

    def __init__(self, n: int, nchunks: int, seconds: float):
        self.n, self.seconds = n, seconds
        self.flops = gemm_flops(n)
        self.chunks = [lambda s=seconds / nchunks: time.sleep(s)] * nchunks


class LoadedSleepCompute(SleepCompute):
    """A SleepCompute on a host with other load: each chunk sleeps speed["factor"] times
    its share, read when it runs (the load can change between a compute's runs)."""

    def __init__(self, n: int, nchunks: int, seconds: float, speed: dict):
        super().__init__(n, nchunks, seconds)
        self.chunks = [lambda s=seconds / nchunks: time.sleep(speed["factor"] * s)] * nchunks


class FakeOverlap(Overlap):
    """The real benchmark with the matmul replaced: compute_s(n) seconds for gemm n (times
    speed["factor"] at run time, when a speed is given)."""

    def __init__(self, compute_s, speed=None):
        self.compute_s, self.speed = compute_s, speed

    def make_compute(self, b, n):
        if self.speed is not None:
            return LoadedSleepCompute(n, b.schedule.nchunks, self.compute_s(n), self.speed)
        return SleepCompute(n, b.schedule.nchunks, self.compute_s(n))


def measure_fake(comm, mode="single", polls=0, progress="none", buckets=4, gemm=64, compute_s=lambda n: C,
                 iters=8, nbytes=4096, harness_cls=Harness, speed=None):
    bench = FakeOverlap(compute_s, speed)
    params = {k: v.default for k, v in Overlap.params.items()}
    params.update(mode=mode, polls=polls, progress=progress, buckets=buckets, gemm=gemm, compute="numpy")
    params = bench.canonical_params(params)
    point = Point("overlap", 1, "float32", nbytes, params)
    bench.validate(point)
    harness = harness_cls(SuiteConfig(name="t", benchmarks=("overlap",), iters=iters, warmup=1, check=True))
    b = bench.setup(comm, point)
    bench.fill(comm, b)
    bench.op(comm, b)()
    ok = bench.check(comm, b)
    rows = bench.measure(harness, comm, point, b)
    assert len(rows) == 1
    return rows[0], ok


# --- the core against the fakes --------------------------------------------------------------

@pytest.mark.serial  # fake durations measured with the clock (15 % of 20 ms: a wake-up late under load)
def test_fully_overlapped():
    row, ok = measure_fake(FakeComm("async"))
    assert ok
    assert row["t_comm_us"] == pytest.approx(D * 1e6, rel=0.15)
    assert row["t_compute_us"] == pytest.approx(C * 1e6, rel=0.15)
    assert row["overlap_osu_pct"] >= 100 - TOL and row["overlap_imb_pct"] >= 100 - TOL
    assert abs(row["exposed_us"]) <= TOL / 100 * D * 1e6
    assert row["compute_slowdown"] == pytest.approx(1.0, abs=0.15)
    assert row["time_us_p50"] == row["t_overall_us"]


@pytest.mark.serial  # fake durations measured with the clock (15 % of 20 ms: a wake-up late under load)
def test_fully_serialised():
    row, ok = measure_fake(FakeComm("wait_only"))
    assert ok
    assert row["t_overall_us"] == pytest.approx((C + D) * 1e6, rel=0.15)
    assert row["overlap_osu_pct"] <= TOL and row["overlap_imb_pct"] <= TOL
    assert row["exposed_us"] == pytest.approx(D * 1e6, rel=0.15)


@pytest.mark.serial  # fake durations measured with the clock (15 % of 20 ms: a wake-up late under load)
def test_half_overlapped():
    # comm 20 ms, compute 10 ms, fully async: overall 20, OSU = 100 - 100 (20 - 10) / 20 = 50,
    # IMB = (20 + 10 - 20) / 20 = 50.
    row, _ = measure_fake(FakeComm("async"), compute_s=lambda n: C / 2)
    assert row["overlap_osu_pct"] == pytest.approx(50, abs=TOL)
    assert row["overlap_imb_pct"] == pytest.approx(50, abs=TOL)


@pytest.mark.serial  # fake durations measured with the clock
def test_polls_and_progress_thread_drive_a_library_that_progresses_only_in_calls():
    """4 steps of 5 ms, each kicked only inside test()/wait(); compute 20 ms.
    polls 0: step 1 runs beside the compute, steps 2-4 in wait(): overall 35, OSU 25 %.
    polls 8 (every 2.2 ms): steps kicked at ~6.7, 13.3 ms, the last in wait() at 20: overall ~25, OSU ~75 %.
    thread: steps back to back from the start, done at 20: OSU ~100 %."""
    r0, _ = measure_fake(FakeComm("steps"))
    r8, _ = measure_fake(FakeComm("steps"), polls=8)
    rt, _ = measure_fake(FakeComm("steps"), progress="thread")
    figs = {k: {f: round(r[f]) for f in ("t_comm_us", "t_compute_us", "t_overall_us", "overlap_osu_pct")}
            for k, r in (("polls0", r0), ("polls8", r8), ("thread", rt))}
    assert r0["overlap_osu_pct"] == pytest.approx(25, abs=TOL), figs
    assert r8["overlap_osu_pct"] == pytest.approx(75, abs=TOL), figs
    # The poller spins in Python and needs a core and the GIL beside the compute thread: 2x the
    # tolerance here (it measured 86-98 % on the loaded 2-core host).
    assert rt["overlap_osu_pct"] >= 100 - 2 * TOL, figs
    assert rt["progress"] == "thread" and rt["polls"] == 0 and r8["polls"] == 8


@pytest.mark.serial  # fake durations measured with the clock
def test_sequence_last_bucket_is_exposed():
    """4 buckets of 5 ms, compute 20 ms in 4 chunks, bucket i started after chunk i, fully
    async: each bucket hides behind the next chunk except the last, started after the
    compute: exposed = one bucket = 25 % of the summed pure time, OSU 75 %."""
    comm = FakeComm("async", duration=D / 4)
    row, ok = measure_fake(comm, mode="sequence", buckets=4)
    assert ok
    assert row["buckets"] == 4 and row["mode"] == "sequence"
    assert row["t_comm_us"] == pytest.approx(D * 1e6, rel=0.15)   # the sum of 4 pure all_reduces
    assert row["t_comm_bucket_us"] == pytest.approx(D / 4 * 1e6, rel=0.15)
    assert row["exposed_pct"] == pytest.approx(25, abs=TOL)
    assert row["overlap_osu_pct"] == pytest.approx(75, abs=TOL)


@pytest.mark.serial  # fake durations measured with the clock (15 % of 20 ms: a wake-up late under load)
def test_calibration_matches_compute_to_comm():
    # compute time grows as n^3: 20 ms at n = 200; the calibration must find n ~ 200 from 64.
    row, _ = measure_fake(FakeComm("async"), gemm=0, compute_s=lambda n: C * (n / 200) ** 3, iters=5)
    assert row["gemm_calibrated"] is True
    assert row["t_compute_us"] == pytest.approx(row["t_comm_us"], rel=0.2)
    assert 170 <= row["gemm_n"] <= 230


def _load_changes_at(stage: str, factor: float):
    """A harness on a host whose other load changes when `stage`'s timed loop starts: until
    then the compute runs `factor` times slower (speed["factor"]), from then on at its own
    pace. The harness arms "<stage> warm-up" as it enters a stage."""
    speed = {"factor": factor}

    class LoadChanges(Harness):
        def arm(self, phase, budget_s=0.0):
            if phase.startswith(stage):
                speed["factor"] = 1.0
            super().arm(phase, budget_s)
    return LoadChanges, speed


@pytest.mark.serial  # counts recalibrations: a busy host adds its own
def test_a_calibration_that_saw_a_slower_host_is_redone_from_the_timed_loop():
    """The calibration sees the compute 3x slower than the timed loop then does (other load
    on the cores until the compute stage starts): it sizes n for 20 ms at 3x, which runs in
    6.7 ms, a 3x miss. The benchmark sizes it again from the timed loop's p50 (n x 3^(1/3))
    and lands on ~20 ms, and the row says it took one more try and carries no warning."""
    LoadChanges, speed = _load_changes_at("compute", 3.0)
    row, _ = measure_fake(FakeComm("async"), gemm=0, compute_s=lambda n: C * (n / 200) ** 3, iters=5,
                          harness_cls=LoadChanges, speed=speed)
    assert row["gemm_recalibrations"] == 1
    assert row["t_compute_us"] == pytest.approx(row["t_comm_us"], rel=0.2)
    assert 170 <= row["gemm_n"] <= 230
    assert "calibration missed" not in (row.get("warning") or "")


def test_a_calibration_that_cannot_reach_its_target_warns():
    # Even the largest CPU multiply (n = 4096) takes 1e-6 x (4096/200)^3 x 20 ms = 0.17 ms here,
    # against a 20 ms all_reduce: the row must say so rather than report its overlap plainly.
    row, _ = measure_fake(FakeComm("async"), gemm=0, compute_s=lambda n: 1e-6 * C * (n / 200) ** 3, iters=3)
    assert row["gemm_n"] == 4096
    assert "calibration missed" in row["warning"] and "largest" in row["warning"]


def test_a_compute_faster_beside_the_all_reduce_is_flagged_and_shown():
    """Compute 2x slower until the overlapped loop starts (the compute stage saw load the
    overlapped run did not): slowdown ~0.5x, which no real overlap can give; the warning
    reaches the row and the terminal table."""
    from rich.console import Console

    LoadChanges, speed = _load_changes_at("overall", 2.0)
    row, _ = measure_fake(FakeComm("async"), iters=4, harness_cls=LoadChanges, speed=speed)
    assert row["compute_slowdown"] == pytest.approx(0.5, abs=0.15)
    assert "compute slowdown" in row["warning"]
    row.update(world=1, nbytes=4096, backend="fake", device="cpu", check="ok")
    console = Console(file=io.StringIO(), width=400)
    console.print(*views.tables(Overlap(), [row], plain=True))
    assert "compute faster beside" in console.file.getvalue()  # the warning's kind; in full with --verbose


def _figs(t_comm, t_compute, t_overall, t_during):
    return overlap_fields(t_comm, t_compute, t_overall, t_during, gemm_flops(64))


@pytest.mark.parametrize("figs,calibrated,want", [
    # the 3x miss of a loaded host: comm 5970, compute 1966 (0.33x), OSU 87 %: overall
    # 1966 + 0.13 x 5970 = 2742, compute during it 845 (slowdown 0.43x)
    (_figs(5970, 1966, 2742, 845), True, ["calibration missed", "compute slowdown 0.43x"]),
    # a quiet host's 25M single bucket, polls 0 (README): nothing odd
    (_figs(8330, 8485, 17939, 8740), True, []),
    # a progress thread that slows the compute 15x: t_overall far above t_comm + t_compute,
    # but the compute as it ran (2447) plus t_comm covers it: not odd
    (_figs(159, 161, 2496, 2447), True, []),
    # overall shorter than the compute alone by 30 %
    (_figs(100, 100, 70, 95), True, ["shorter than its own compute"]),
    # the wait after the compute took 3x the pure all_reduce: (100 + 100) x 1.2 = 240 < 300
    (_figs(100, 100, 300, 100), True, ["the wait outlasted the all_reduce"]),
    # within noise of the same bound
    (_figs(100, 100, 230, 100), True, []),
    # a fixed gemm has no target: 4x the comm is what the user asked for
    (_figs(100, 400, 420, 400), False, []),
    # the warning factor's edges: 1.49x passes, 1.51x does not
    (_figs(100, 149, 160, 149), True, []),
    (_figs(100, 151, 160, 151), True, ["calibration missed"]),
    (_figs(100, 100 / 1.51, 110, 100 / 1.51), True, ["calibration missed"]),
])
def test_row_warnings(figs, calibrated, want):
    got = row_warnings(figs, calibrated)
    assert len(got) == len(want), got
    for w, g in zip(want, got):
        assert w in g, (w, g)


def test_calibrate_gemm_is_deterministic_given_the_agreed_times():
    seen = []

    def agree(t):
        seen.append(t)
        return t
    comp = calibrate_gemm(0.004, lambda n: SleepCompute(n, 1, 0.004 * (n / 100) ** 3), agree, lo=8, hi=4096)
    assert 85 <= comp.n <= 115 and len(seen) <= 8


def test_check_catches_a_wrong_all_reduce():
    _, ok = measure_fake(FakeComm("async", corrupt=True), iters=2)
    assert not ok


@pytest.mark.serial  # fake durations measured with the clock (15 % of 20 ms: a wake-up late under load)
def test_bandwidth_is_the_pure_all_reduce():
    row, _ = measure_fake(FakeComm("async"), nbytes=1 << 20)
    assert row["algbw_gbps"] == pytest.approx((1 << 20) / (row["t_comm_bucket_us"] * 1e-6) / 1e9, rel=1e-6)


def test_core_rejects_mismatched_chunks():
    sched = make_schedule("single", 1, 3)
    with pytest.raises(ValueError):
        OverlapCore(FakeComm("async"), SleepCompute(8, 2, 0.001), [np.zeros(4)], [np.zeros(4)], sched)


# --- the real matmul ---------------------------------------------------------------------------

@pytest.mark.parametrize("lib", ["numpy", pytest.param("torch", marks=needs_torch)])
def test_gemm_chunks_compute_the_exact_product(lib):
    g = Gemm(40, 3, lib)
    assert not g.check()  # NaN until computed
    g.run()
    assert g.check()
    a, b = (np.asarray(x, dtype=np.float64) for x in (g.a, g.b))
    assert set(np.unique(a)) == {-1, 0, 1} and np.linalg.matrix_rank(a) > 1
    assert np.array_equal(g.result(), a @ b)
    g.c[13, 0] += 1  # row 13 is the first of chunk 1
    assert not g.check()
    g.reset()
    for c in g.chunks[:-1]:
        c()
    assert not g.check()  # the last chunk's rows are still NaN
    with pytest.raises(Exception, match="fewer rows"):
        Gemm(2, 3, lib)


# --- validation, table, suite -------------------------------------------------------------------

def test_canonical_params_drop_duplicates():
    b = Overlap()
    p = {k: v.default for k, v in b.params.items()}
    assert b.canonical_params({**p, "buckets": 4})["buckets"] == p["buckets"]  # single ignores buckets
    assert b.canonical_params({**p, "mode": "sequence", "buckets": 4})["buckets"] == 4
    assert b.canonical_params({**p, "progress": "thread", "polls": 8})["polls"] == 0


def test_table_renders():
    from rich.console import Console

    row, _ = measure_fake(FakeComm("async"), iters=2)
    row.update(world=1, nbytes=4096, backend="fake", device="cpu", check="ok")
    console = Console(file=io.StringIO(), width=250)
    console.print(*views.tables(Overlap(), [row], plain=True))
    text = console.file.getvalue()
    for col in ("t_comm", "t_overall", "OSU %", "IMB %", "slowdown", "exposed (us)", "GFLOP/s alone", "check"):
        assert col in text
    assert "single" in text and "polls 0" in text


def test_suite_expands():
    cfg = build_config(read_suite("overlap"))
    points, _ = expand(cfg, 2, ("float32", "float16", "int32"))
    modes = {(p.params["mode"], p.params["polls"], p.params["progress"]) for p in points}
    assert modes == {(m, po, pr) for m in ("single", "sequence") for po, pr in ((0, "none"), (8, "none"),
                                                                                 (0, "thread"))}
    assert {p.nbytes for p in points} == {1 << 20, 4 << 20, 25 << 20}
    assert cfg.check and all(p.world == 2 for p in points)


@pytest.mark.parametrize("params,msg", [
    (["overlap.mode=sequence", "overlap.buckets=1"], "buckets >= 2"),
    (["overlap.gemm=4", "overlap.polls=8"], "fewer rows"),
    (["overlap.progress=both"], "not one of"),
])
@pytest.mark.multirank
def test_bad_params_exit_2(tmp_path, params, msg):
    args = ["run", "-b", "overlap", "--np", 2, "--sizes", "64K"]
    for p in params:
        args += ["--param", p]
    r = run_cli(*args, cwd=tmp_path)
    assert r.returncode == 2 and msg in r.stderr, r.stderr
    assert not (tmp_path / "results").exists()


# --- real ranks through the CLI ---------------------------------------------------------------

FIELDS = ("t_comm_us", "t_compute_us", "t_overall_us", "t_compute_during_us", "overlap_osu_pct", "overlap_imb_pct",
          "compute_slowdown", "exposed_us", "exposed_pct", "gflops_alone", "gflops_overlapped", "compute_backend",
          "progress", "polls", "mode", "buckets", "gemm_n")


def _run(tmp_path, backend, extra):
    from commbench.store.load import load

    out = tmp_path / backend
    p = run_cli("run", "-b", "overlap", "--backend", backend, "--np", 2, "--sizes", "64K,1M", "--check",
                "--iters", 4, "--warmup", 1, "--param", "buckets=4", "--out", out, *extra, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p, load(out)


def _assert_rows(df, n, compute):
    assert len(df) == n
    for f in FIELDS:
        assert f in df.columns, f
    assert (df["check"] == "ok").all(), df[["nbytes", "params", "check"]]
    for col in ("overlap_osu_pct", "overlap_imb_pct"):
        assert ((df[col] >= 0) & (df[col] <= 100)).all(), df[col]
    assert (df["compute_slowdown"] > 0).all()
    assert (df["time_us_p50"] == df["t_overall_us"]).all()
    assert (df["compute_backend"] == compute).all()
    assert df["gemm_calibrated"].all()
    assert set(df["mode"]) == {"single", "sequence"}
    assert (df[df["mode"] == "sequence"]["buckets"] == 4).all() and (df[df["mode"] == "single"]["buckets"] == 1).all()


@needs_mpi
@pytest.mark.multirank
def test_mpi_two_ranks(tmp_path):
    p, df = _run(tmp_path, "mpi", ["--param", "mode=single,sequence", "--param", "polls=0,4",
                                   "--param", "progress=none,thread"])
    _assert_rows(df, 2 * 2 * 3, "numpy")
    assert {(r["polls"], r["progress"]) for _, r in df.iterrows()} == {(0, "none"), (4, "none"), (0, "thread")}


@needs_torch
@pytest.mark.multirank
def test_gloo_two_ranks(tmp_path):
    p, df = _run(tmp_path, "gloo", ["--param", "mode=single,sequence", "--param", "progress=none,thread"])
    _assert_rows(df, 2 * 2 * 2, "torch-cpu")
    assert (df["compute_threads_set_by"] == "torch.set_num_threads").all()


@needs_mpi
@pytest.mark.multirank
def test_check_catches_a_corrupted_bucket(tmp_path):
    from commbench.store.load import load

    out = tmp_path / "bad"
    p = run_cli("run", "-b", "overlap_corrupt", "--backend", "mpi", "--np", 2, "--sizes", "64K", "--check",
                "--iters", 2, "--param", "overlap_corrupt.mode=sequence", "--param", "overlap_corrupt.buckets=2",
                "--out", out, env={"COMMBENCH_PLUGINS": "overlap_corrupt_plugin"})
    assert p.returncode != 0 and "failed the data check" in p.stderr
    assert set(load(out)["check"]) == {"fail"}


# --- a C reference: osu_iallreduce's measurement, no Python ----------------------------------

# OSU's osu_iallreduce is not installed here; this is its measurement in C (a busy-loop
# compute calibrated to t_pure, as OSU's dummy compute is): if the library makes no progress
# outside MPI calls, both it and commbench show it, and polls help both alike.
C_REFERENCE = r"""/* osu_iallreduce's measurement in ~80 lines: t_pure (MPI_Iallreduce + MPI_Wait), a host
 * compute calibrated to t_pure, t_overall (start, compute with `polls` MPI_Test calls
 * spread over it, wait). Page-aligned float32 buffers, barrier between iterations, each
 * figure the median over iterations, then the slowest rank's. Prints one line on rank 0:
 * nbytes polls t_pure_us t_compute_us t_overall_us overlap_osu_pct */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static volatile double sink;
static void compute(long n) { double a = 1.0; for (long i = 0; i < n; i++) a = a * 1.0000001 + 1e-9; sink = a; }
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return (x > y) - (x < y); }
static double med(double *t, int n) { qsort(t, n, sizeof *t, cmp); return t[n / 2]; }
static double slowest(double v) { double o; MPI_Allreduce(&v, &o, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); return o; }

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    long nbytes = argc > 1 ? atol(argv[1]) : 1 << 20;
    int polls = argc > 2 ? atoi(argv[2]) : 0, iters = argc > 3 ? atoi(argv[3]) : 50, rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int count = (int)(nbytes / 4);
    float *s, *r;
    posix_memalign((void **)&s, 4096, nbytes); posix_memalign((void **)&r, 4096, nbytes);
    for (int i = 0; i < count; i++) s[i] = (float)(i % 7);
    double *t = malloc(sizeof(double) * iters), t0;
    MPI_Request req;
    for (int i = 0; i < iters + 5; i++) {                     /* t_pure */
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        MPI_Iallreduce(s, r, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        if (i >= 5) t[i - 5] = MPI_Wtime() - t0;
    }
    double t_pure = slowest(med(t, iters));
    long work = 1000;                                          /* calibrate the compute */
    for (;;) {
        t0 = MPI_Wtime(); compute(work); double dt = MPI_Wtime() - t0;
        if (dt > 0.2 * t_pure) { work = (long)(work * t_pure / dt); break; }
        work *= 2;
    }
    MPI_Allreduce(MPI_IN_PLACE, &work, 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
    long chunk = work / (polls + 1);
    for (int i = 0; i < iters; i++) {                         /* t_compute */
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        for (int k = 0; k <= polls; k++) compute(chunk);
        t[i] = MPI_Wtime() - t0;
    }
    double t_comp = slowest(med(t, iters));
    for (int i = 0; i < iters; i++) {                         /* t_overall */
        int flag;
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        MPI_Iallreduce(s, r, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req);
        for (int k = 0; k <= polls; k++) { compute(chunk); if (k < polls) MPI_Test(&req, &flag, MPI_STATUS_IGNORE); }
        MPI_Wait(&req, MPI_STATUS_IGNORE);
        t[i] = MPI_Wtime() - t0;
    }
    double t_all = slowest(med(t, iters));
    double ov = 100.0 - 100.0 * (t_all - t_comp) / t_pure;
    if (ov < 0) ov = 0; if (ov > 100) ov = 100;
    if (rank == 0) printf("%ld %d %.1f %.1f %.1f %.1f\n", nbytes, polls, t_pure * 1e6, t_comp * 1e6, t_all * 1e6, ov);
    MPI_Finalize();
    return 0;
}
"""


def _c_reference(tmp_path):
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from commbench.run.launcher import mpirun_command

    bindir = Path(sys.executable).parent
    mpicc = next((str(p) for p in (bindir / "mpicc",) if p.exists()), None) or shutil.which("mpicc")
    if mpicc is None:
        pytest.skip("no mpicc")
    src, exe = tmp_path / "ov.c", tmp_path / "ov"
    src.write_text(C_REFERENCE)
    cp = subprocess.run([mpicc, "-O2", "-o", str(exe), str(src)], capture_output=True, text=True, timeout=120)
    if cp.returncode:
        pytest.skip(f"mpicc failed: {cp.stderr[-300:]}")
    base = mpirun_command(2, [])[:-3]  # mpirun and its flags, without "python -m commbench"

    def run(nbytes, polls):
        out = subprocess.run(base + [str(exe), str(nbytes), str(polls), "40"], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        f = out.stdout.split()
        return {"t_pure": float(f[2]), "t_compute": float(f[3]), "t_overall": float(f[4]), "osu": float(f[5])}
    return run


def _median(xs):
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2


@needs_mpi
@pytest.mark.multirank
def test_c_reference_agrees(tmp_path):
    """1 MiB on 2 ranks, polls 0 and 8: commbench's OSU overlap agrees with the C loop's.

    Both are medians of noisy 2-core runs, and on a busy host either one moves by tens of
    points from run to run (a CI host gave the C loop 30 % at polls 0, where a quiet one
    gives 1 %). So each side is measured three times (the C loop three launches, commbench
    one launch with --repeat 3) and their medians must agree within 30 points plus what the
    two sides' own repeats spread over: a formula or loop that is off shows on a quiet host,
    and a noisy host widens the margin by what it visibly did. Quiet-host figures: polls 0
    0 % vs 1 %, polls 8 47 % vs 45 %."""
    from commbench.store.load import load

    ref = _c_reference(tmp_path)
    c = {p: [ref(1 << 20, p) for _ in range(3)] for p in (0, 8)}
    out = tmp_path / "cb"
    p = run_cli("run", "-b", "overlap", "--backend", "mpi", "--np", 2, "--sizes", "1M", "--iters", 30,
                "--param", "polls=0,8", "--repeat", 3, "--out", out, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    df = load(out)
    for polls in (0, 8):
        rows = df[df["polls"].astype(int) == polls]
        assert len(rows) == 3, rows
        cb = [float(x) for x in rows["overlap_osu_pct"]]
        ref_osu = [x["osu"] for x in c[polls]]
        margin = 30 + (max(cb) - min(cb) + max(ref_osu) - min(ref_osu)) / 2
        assert abs(_median(cb) - _median(ref_osu)) <= margin, (polls, cb, ref_osu, margin)
        # The same 1 MiB all_reduce timed by two loops: within 10x of each other, which catches a
        # unit slip (us against ns or ms is 1000x). Not closer: on a shared VM the C loop's time and
        # mpi4py's have been measured 3.4x and 4.0x apart at once (256 vs 854 us, 226 vs 911 us),
        # with the OSU % still agreeing: the overlap figure is what this test holds to.
        t_cb = _median([float(x) for x in rows["t_comm_us"]])
        t_c = _median([x["t_pure"] for x in c[polls]])
        assert 0.1 < t_cb / t_c < 10, (polls, t_cb, t_c)
