"""The one sampling loop every benchmark's time goes through (Harness), and the mark a
repeat leaves on a point's key."""
from __future__ import annotations

import numpy as np

from commbench.analyse import pairs as pairs_analysis
from commbench.backends.timing import clock_name
from commbench.benchmarks import get
from commbench.core import hoststate
from commbench.core.schema import SCHEMA_VERSION, point_key
from commbench.core.stats import bandwidths_gbps, calibrate_iters, summarize_us
from commbench.core.units import fmt_size
from commbench.run import plant
from commbench.run import suite as suite_mod
from commbench.run.variants import BUILTIN


class Harness:
    """The one sampling loop. Every benchmark's time goes through _sample(): warm-up, an
    iteration count every rank agrees on, the watchdog's budget, the slowest rank per
    iteration, statistics and bandwidths. How one iteration is clocked is the backend's
    (Comm.time_ops for one operation, Comm.time_steps for a multi-stage step), so a change
    to how time is taken is made there, once, for every benchmark."""

    def __init__(self, cfg: suite_mod.SuiteConfig, guard=None, variant=None):
        self.cfg = cfg
        self.guard = guard
        self.variant = variant or BUILTIN["default"]
        self.where = ""
        # What benchmarks may ask of the harness (they never read cfg themselves).
        self.check = bool(cfg.check)
        self.barrier_each = cfg.timing == "barrier"
        self.per_op_events = bool(cfg.per_op_events)
        self.ranks_per_core = 1.0  # of the communicator the points run on (sweep sets it per world)
        self.repeat = 1  # which repeat of its point this is (cfg.repeat)
        # What a point leaves beside its rows (rank 0's): files for the run directory, meta
        # entries and lines to say; the sweep takes them after the point (take_kept).
        self.kept: dict = {"files": {}, "meta": {}, "lines": []}
        self.pair_tags = plant.pair_tags()  # the pairs benchmark's test hook, said in its rows

    # The pairs benchmark's schedule and verdict are analysis (analyse/pairs.py), a layer
    # above the benchmarks: the harness hands them over.
    pairs = pairs_analysis

    def pair_op(self, op, rank: int, peer: int):
        """An exchange of the pairs benchmark as it is timed (plant.py's planted pair)."""
        return plant.pair_op(op, rank, peer)

    def keep(self, files: dict | None = None, meta: dict | None = None, lines: list | None = None) -> None:
        """Files (name -> text), meta.json entries and lines a point leaves (rank 0)."""
        self.kept["files"].update(files or {})
        self.kept["meta"].update(meta or {})
        self.kept["lines"].extend(lines or [])

    def take_kept(self) -> dict:
        kept, self.kept = self.kept, {"files": {}, "meta": {}, "lines": []}
        return kept

    def arm(self, phase: str, budget_s: float = 0.0) -> None:
        if self.guard is not None:
            where = f"{self.where} variant {self.variant.name}" if self.where else ""
            self.guard.arm(f"{where} ({phase})" if where else phase, budget_s)

    def _sample(self, comm, timer, traffic, stage: str, ops_per_sample: int = 1) -> tuple[dict, object]:
        """timer(n) -> (n samples in seconds, extra per-sample data or None). A backend that
        samples device time says how in comm.last_timing (timing.HeldTimes.info: operations
        per sample, the host's cost per operation, whether every batch was held)."""
        cfg = self.cfg
        self.arm(f"{stage + ' ' if stage else ''}warm-up")
        comm.barrier()
        comm.last_timing = {}
        warm, _ = timer(max(cfg.warmup, 0 if cfg.iters else 1))
        info = comm.last_timing
        # The wall time of a sample: its operations at the slower of device and host pace
        # (a held batch of 200 tiny operations lasts 200 host launches, not 200 x 10 ns).
        per_op = max(float(np.median(warm)) if len(warm) else 0.0, (info.get("host_us_per_op") or 0.0) * 1e-6)
        sample_s = per_op * (info.get("ops_per_sample") or ops_per_sample)
        # Every rank must run the same count: agree on the slowest rank's estimate.
        est = float(comm.max_over_ranks(np.array([sample_s]))[0])
        iters = cfg.iters or calibrate_iters(est, cfg.min_time_ms / 1e3, cfg.min_iters, cfg.max_iters)
        # The watchdog allows the loop twice its expected time on top of the timeout.
        self.arm(f"{stage + ' ' if stage else ''}timed loop", 2 * iters * est)
        comm.barrier()
        comm.last_timing = {}
        times, extra = timer(iters)
        info = dict(comm.last_timing)
        times = comm.max_over_ranks(times)
        stats = summarize_us(times)
        algbw, busbw = bandwidths_gbps(traffic.nbytes, stats["time_us_p50"], traffic.busbw_factor)
        frag = {"stage": stage, "iters": iters, "warmup": cfg.warmup, "timing": cfg.timing, **stats,
                "algbw_gbps": algbw, "busbw_gbps": busbw, "busbw_factor": traffic.busbw_factor, **info}
        if info.get("held") is False and info.get("hold_method") != "none":
            # Never silently: a batch whose hold ended before the host finished enqueueing it
            # may hold host time.
            frag["warning"] = (f"{info.get('unheld_samples')} of {len(times)} samples were not covered by the "
                               f"stream hold: they may include host launch time"
                               + (f" ({info['unheld_reason']})" if info.get("unheld_reason") else ""))
        return frag, extra

    def time_op(self, comm, point, op, traffic, stage: str = "") -> dict:
        """One prepared operation, back to back or with a barrier after each (cfg.timing)."""
        graph = bool(self.cfg.cuda_graph)
        kw = {k: True for k, on in (("cuda_graph", graph), ("per_op_events", self.per_op_events)) if on}
        planted = plant.planted_pct(point)
        if planted is not None:  # the regression gate's test hook (plant.py)
            op = plant.wrap(op, planted, comm)

        def timer(n):
            return comm.time_ops(op, n, barrier_each=self.barrier_each, **kw), None
        frag, _ = self._sample(comm, timer, traffic, stage)
        # A device backend names its clock per call (held batches or not); graphs and the
        # compiled loop are named here.
        if graph or "clock" not in frag:
            frag["clock"] = clock_name(graph, comm, op)
        if planted is not None:
            frag["planted_delay_pct"] = planted
        return frag

    def time_steps(self, comm, point, step, traffic, stage: str = "", laps: tuple = (),
                   barrier_each: bool | None = None, after_each=None, hold: bool = False,
                   host_waits: tuple = (), restart=None) -> tuple[dict, np.ndarray]:
        """A multi-stage step (moe's dispatch, overlap's overlapped run): step(lap) runs one
        iteration and calls lap() after each stage named in `laps`. The fragment gets
        stage_us_<name> (median over iterations of the slowest rank's time); the per-iteration
        stage seconds (slowest rank) come back too. barrier_each: None follows cfg.timing.
        after_each(i), if given, runs after iteration i outside its timing (a benchmark's own
        per-iteration bookkeeping). hold: on a device, hold the stream while each step is
        enqueued; host_waits: the names of the stages in `laps` that wait for the device on
        the host (the hold is let go before them and put up again after). restart(), if
        given, runs before the warm-up and again before the timed loop (a benchmark whose
        iterations cycle through states starts each loop at the first)."""
        barrier = self.barrier_each if barrier_each is None else barrier_each
        kw = {"hold": True} if hold else {}
        if hold and host_waits:
            kw["host_waits"] = tuple(laps.index(name) for name in host_waits)
        count = [0]

        def counted(lap):
            step(lap)
            after_each(count[0])
            count[0] += 1
        # One step object for every call (warm-up and timed loop): a backend that keys
        # per-step state by identity (TorchComm's first unheld run) sees the same step.
        run = step if after_each is None else counted

        def timer(n):
            count[0] = 0
            if restart is not None:
                restart()
            return comm.time_steps(run, n, len(laps), barrier, **kw)
        frag, lap_s = self._sample(comm, timer, traffic, stage)
        lap_s = comm.max_over_ranks(lap_s.ravel()).reshape(lap_s.shape) if lap_s.size else lap_s
        frag.update({f"stage_us_{name}": float(np.median(lap_s[:, i])) * 1e6 for i, name in enumerate(laps)})
        frag.setdefault("clock", comm.timing_method)
        if barrier_each is not None:
            frag["timing"] = "barrier" if barrier else "back_to_back"
        return frag, lap_s

    def run_point(self, comm, point) -> list[dict]:
        bench = get(point.benchmark)
        self.where = describe_point(point)
        self.arm("setup")
        bufs = bench.setup(comm, point)
        check = "skipped"
        bench.fill(comm, bufs)
        if self.check and bench.checks:
            self.arm("check")
            bench.op(comm, bufs)()
            comm.sync()
            ok = bench.check(comm, bufs)
            check = "ok" if comm.min_over_ranks(np.array([1.0 if ok else 0.0]))[0] > 0 else "fail"
        watch = hoststate.PointWatch()
        watch.start()
        frags = bench.measure(self, comm, point, bufs)
        host = watch.finish(comm, self.ranks_per_core)
        why = host.pop("_disturbed_why")
        # Peak resident memory so far (the slowest-to-free rank's), to show buffers are
        # allocated once per point and nothing grows with the iterations.
        import resource

        rss = float(comm.max_over_ranks(np.array([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0]))[0])
        placement = bench.placement(comm, point)
        base = {"schema": SCHEMA_VERSION,
                "point_key": point_key(point.benchmark, point.world, point.nbytes, point.dtype, point.params,
                                       self.variant.name, placement) + repeat_suffix(self.repeat),
                "repeat": self.repeat,
                "benchmark": point.benchmark, "backend": comm.backend, "device": comm.device, "world": point.world,
                "nbytes": point.nbytes, "dtype": point.dtype, "variant": self.variant.name, "placement": placement,
                "inswitch": self.variant.inswitch, "variant_env": self.variant.env, "params": point.params}
        return [{**base, **frag, "check": frag.get("check", check), "rss_peak_mib": rss, **host,
                 **({"warning": "; ".join(x for x in (frag.get("warning"), f"disturbed: {why}") if x)} if why else {})}
                for frag in frags]


def describe_point(point) -> str:
    """How a failure message names a point: benchmark, size and dtype (or its parameters),
    placement, rank count."""
    what = (" ".join(f"{k}={v}" for k, v in point.params.items()) if point.params else
            f"{fmt_size(point.nbytes)} {point.dtype}")
    return f"{point.benchmark} {what}{' in-place' if point.in_place else ''} world {point.world}"


def repeat_suffix(rep: int) -> str:
    """The point key's mark of a repeat after the first (the first keeps the plain key)."""
    return f"|repeat{rep}" if rep > 1 else ""
