"""THE harness: setup -> check -> warm-up (calibration) -> timed iterations -> row."""
from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import numpy as np

from . import backends, launch, suite as suite_mod
from .benchmarks import get
from .report import stdout_is_tty
from .results import SCHEMA_VERSION, RunWriter, base_meta
from .stats import bandwidths_gbps, calibrate_iters, summarize_us
from .units import fmt_size


def node_ids(hosts: list[str], ranks_per_node: int | None) -> list[int]:
    """Node of each rank: by hostname, or rank // ranks_per_node to model two tiers on one host."""
    if ranks_per_node:
        return [r // ranks_per_node for r in range(len(hosts))]
    order: dict[str, int] = {}
    return [order.setdefault(h, len(order)) for h in hosts]


def describe(point) -> str:
    """How a failure message names a point: benchmark, size, dtype, rank count, variant."""
    what = (" ".join(f"{k}={v}" for k, v in point.params.items()) if point.params else
            f"{fmt_size(point.nbytes)} {point.dtype}")
    return f"{point.benchmark} {what} world {point.world}"


def clock_name(cfg, comm, op) -> str:
    """How a row's samples were clocked: the loop in C (mpi_timeloop) reads the same
    monotonic clock per iteration as the Python loop, and the row says which loop ran."""
    if cfg.cuda_graph:
        return "cuda_graph"
    if getattr(op, "compiled_loop", None) is not None:
        return "host_clock_compiled_loop"
    return comm.timing_method


class Harness:
    def __init__(self, cfg: suite_mod.SuiteConfig, guard=None, variant=None):
        from .variants import BUILTIN

        self.cfg = cfg
        self.guard = guard
        self.variant = variant or BUILTIN["default"]
        self.where = ""

    def arm(self, phase: str, budget_s: float = 0.0) -> None:
        if self.guard is not None:
            where = f"{self.where} variant {self.variant.name}" if self.where else ""
            self.guard.arm(f"{where} ({phase})" if where else phase, budget_s)

    def time_op(self, comm, point, op, traffic, stage: str = "", timer=None) -> dict:
        """Warm up, settle the iteration count, time each iteration; an iteration's time is
        the slowest rank's (a collective is done when its last rank is)."""
        cfg = self.cfg
        if timer is None:
            barrier_each = cfg.timing == "barrier"

            def timer(op, n):
                if cfg.cuda_graph:
                    return comm.time_ops(op, n, barrier_each=barrier_each, cuda_graph=True)
                return comm.time_ops(op, n, barrier_each=barrier_each)
        self.arm(f"{stage + ' ' if stage else ''}warm-up")
        comm.barrier()
        warm = timer(op, max(cfg.warmup, 0 if cfg.iters else 1))
        # Every rank must run the same count: agree on the slowest rank's estimate.
        est = float(comm.max_over_ranks(np.array([np.median(warm) if len(warm) else 0.0]))[0])
        iters = cfg.iters or calibrate_iters(est, cfg.min_time_ms / 1e3, cfg.min_iters, cfg.max_iters)
        # The watchdog allows the loop twice its expected time on top of the timeout; a CUDA
        # graph replays up to 100 operations per sample (timing.choose_ops_per_replay).
        self.arm(f"{stage + ' ' if stage else ''}timed loop", 2 * iters * est * (100 if cfg.cuda_graph else 1))
        comm.barrier()
        times = comm.max_over_ranks(timer(op, iters))
        stats = summarize_us(times)
        algbw, busbw = bandwidths_gbps(traffic.nbytes, stats["time_us_p50"], traffic.busbw_factor)
        return {"stage": stage, "iters": iters, "warmup": cfg.warmup, "timing": cfg.timing, "clock": clock_name(cfg, comm, op),
                **stats, "algbw_gbps": algbw, "busbw_gbps": busbw, "busbw_factor": traffic.busbw_factor}

    def run_point(self, comm, point) -> list[dict]:
        bench = get(point.benchmark)
        self.where = describe(point)
        self.arm("setup")
        bufs = bench.setup(comm, point)
        check = "skipped"
        bench.fill(comm, bufs)
        if self.cfg.check and bench.checks:
            self.arm("check")
            bench.op(comm, bufs)()
            comm.sync()
            ok = bench.check(comm, bufs)
            check = "ok" if comm.min_over_ranks(np.array([1.0 if ok else 0.0]))[0] > 0 else "fail"
        frags = bench.measure(self, comm, point, bufs)
        # Peak resident memory so far (the slowest-to-free rank's), to show buffers are
        # allocated once per point and nothing grows with the iterations.
        import resource

        rss = float(comm.max_over_ranks(np.array([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0]))[0])
        base = {"schema": SCHEMA_VERSION, "point_key": point_key(point, self.variant.name), "benchmark": point.benchmark,
                "backend": comm.backend,
                "device": comm.device, "world": point.world, "nbytes": point.nbytes, "dtype": point.dtype,
                "variant": self.variant.name, "inswitch": self.variant.inswitch, "variant_env": self.variant.env,
                "params": point.params}
        return [{**base, **frag, "check": frag.get("check", check), "rss_peak_mib": rss} for frag in frags]


class Progress:
    """Rank 0's progress: a rich bar on a terminal, one plain line per point otherwise."""

    def __init__(self, total: int, enabled: bool):
        self.enabled = enabled
        self.tty = enabled and stdout_is_tty()
        self.total, self.done = total, 0
        if self.tty:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress as RP, TextColumn, TimeElapsedColumn

            self.bar = RP(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            self.task = self.bar.add_task("sweep", total=total)
            self.bar.start()

    def update(self, point, rows):
        self.done += 1
        if not self.enabled:
            return
        desc = f"{point.benchmark} w{point.world} " + (
            " ".join(f"{k}={v}" for k, v in point.params.items()) if point.params else f"{point.dtype} {point.nbytes}B")
        if self.tty:
            self.bar.update(self.task, advance=1, description=desc)
        else:
            figs = "; ".join(f"{r.get('stage') or 'p50'} {r['time_us_p50']:.2f} us busbw {r['busbw_gbps']:.3f} GB/s"
                             for r in rows)
            print(f"[{self.done}/{self.total}] {desc}: {figs}; check {rows[0]['check']}", flush=True)

    def close(self):
        if self.tty:
            self.bar.stop()


def default_profile_name(device: str, gpu_names: list[str]) -> str | None:
    """loopback for CPU ranks; on GPUs the built-in profile whose GPU the device names."""
    if device == "cpu":
        return "loopback"
    name = (gpu_names or [""])[0].upper()
    for key, prof in (("GB300", "gb300-nvl72"), ("GB200", "gb200-nvl72"), ("B200", "b200-hgx"), ("B300", "b200-hgx"),
                      ("H200", "h200-hgx"), ("H800", "h800-hgx"), ("H100", "h100-hgx"), ("A100", "a100-hgx")):
        if key in name:
            return prof
    return None


def resolve_profile(cfg, overrides: dict, comm, device: str, gpu_names: list[str]):
    """The profile rows are compared with (collective: the loopback one is measured here).
    Returns (profile or None, meta dict)."""
    from . import ceilings, probe

    name = cfg.profile or default_profile_name(device, gpu_names)
    if name is None:
        return None, {"profile": None, "note": "no profile for this GPU: pass --profile"}
    prof = ceilings.load_profile(name)
    meta = {"profile": prof.name, "chosen": "given" if cfg.profile else "default"}
    if prof.measured:
        m = probe.loopback_probe(comm)
        meta["probe"] = m
        if m.get("latency_us") is None:
            m["latency_us"] = 0.0
        prof = ceilings.loopback_profile(m["memcpy_in_cache_gbps"], m["memcpy_beyond_cache_gbps"],
                                         m["llc_nbytes"], m["latency_us"])
    prof = ceilings.apply_overrides(prof, overrides or {})
    from dataclasses import asdict

    meta["fields"] = asdict(prof)
    return prof, meta


def point_key(point, variant: str = "default") -> str:
    """What identifies a point across a run, its variants and its resumption."""
    import json

    return (f"{variant}|{point.benchmark}|{point.world}|{point.nbytes}|{point.dtype}|"
            f"{json.dumps(point.params, sort_keys=True)}")


STATUS_ORDER = ("failed", "interrupted", "check_failed", "running", "complete")


def overall_status(variant_meta: dict) -> str:
    """A run of several variant launches is as bad as its worst variant (skipped ones aside)."""
    states = [v.get("status") for v in variant_meta.values() if v.get("status") != "skipped"]
    for s in STATUS_ORDER:
        if s in states:
            return s
    return "complete"


def run(cfg: suite_mod.SuiteConfig, backend_name: str, device: str | None, out_dir, argv: list[str],
        ranks_per_node: int | None = None, profile_overrides: dict | None = None, resume: bool = False,
        variant: str = "default", join: bool = False) -> int:
    """Run a validated suite on this rank (inside a launch) for one variant; returns the
    exit status. resume: out_dir holds an unfinished run of this suite; its finished points
    are skipped. join: out_dir may hold this suite's run for other variants: add to it."""
    import os

    from .variants import BUILTIN

    the_variant = next((v for v in suite_mod.resolve_variants(cfg) if v.name == variant), None) or BUILTIN[variant]
    # Before the library starts: NCCL and MPI read their settings once, at initialisation.
    os.environ.update(the_variant.env)
    from .guard import Guard
    from .results import read_rows

    info = launch.detect()
    points, notes = suite_mod.expand(cfg, info.world, backends.BACKEND_DTYPES[backend_name])
    if backend_name in ("gloo", "nccl"):
        launch.prepare_torch_env(info)
    backend = backends.create(backend_name, device)
    world = backend.init(info)
    is_root = world.rank == 0
    # Every rank names a directory under an external launcher; rank 0's is the run's.
    out_dir = world.allgather_obj(str(out_dir))[0]
    guard = Guard(world.rank, world.size, out_dir, cfg.timeout_s)
    guard.start()
    guard.arm("start-up")
    hosts = world.allgather_obj(socket.gethostname())
    nodes = node_ids(hosts, ranks_per_node)
    guard.arm("loopback probe")
    # A run that other launches add to (variants, resume) keeps the ceiling it was judged by.
    prior = None
    if is_root and (join or resume):
        from .results import load_meta

        prior = (load_meta(out_dir) or {}).get("ceilings")
    prior = world.allgather_obj(prior)[0]
    if prior and prior.get("fields"):
        from . import ceilings

        fields = {k: v for k, v in prior["fields"].items() if k in ceilings.Profile.__dataclass_fields__}
        profile, prof_meta = ceilings.Profile(**fields), prior
    else:
        profile, prof_meta = resolve_profile(cfg, profile_overrides, world, backend.device, backend.gpu_names())
    writer = None
    done_keys: set = set()
    if is_root:
        from .results import load_meta

        existing = load_meta(out_dir) if (resume or join) else {}
        if existing:
            meta = existing
            old_rows = read_rows(Path(out_dir) / "rows.jsonl") if (Path(out_dir) / "rows.jsonl").is_file() else []
            done_keys = {r.get("point_key") for r in old_rows}
            if resume:
                meta.setdefault("resumed", []).append({"at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "argv": argv,
                                                       "previous_status": meta.get("status"),
                                                       "previous_reason": meta.get("reason")})
            meta.update(status="running", reason=None)
        else:
            meta = base_meta(argv)
            meta.update({"suite": cfg.name, "config": _cfg_dict(cfg), "backend": backend_name,
                         "device": backend.device, "world": world.size, "launcher": info.launcher,
                         "hosts": hosts, "nodes": nodes, "ranks_per_node": ranks_per_node,
                         "gpus": backend.gpu_names(), "points": len(points), "ceilings": prof_meta,
                         "profile_overrides": profile_overrides or {}})
            meta["versions"].update(backend.versions())
            if backend_name == "mpi" and backend.device == "cpu":
                from .backends import mpi_timeloop

                mpi_timeloop.load(world.MPI)
                meta["timing_loop"] = mpi_timeloop.status()
        entry = meta.setdefault("variants", {}).setdefault(the_variant.name, {})
        entry.update(env=the_variant.env, inswitch=the_variant.inswitch, description=the_variant.description,
                     status="running")
        writer = RunWriter(out_dir, meta)

        def on_fatal(status, reason, writer=writer, name=the_variant.name):
            writer.meta["variants"][name]["status"] = status
            writer.finish(status, reason)
        guard.on_fatal = on_fatal
        for n in notes:
            print(f"note: {n}", flush=True)
    done_keys = set(world.allgather_obj(sorted(k for k in done_keys if k))[0])
    todo = [p for p in points if point_key(p, the_variant.name) not in done_keys]
    if is_root and resume:
        print(f"resume: {len(points) - len(todo)} of {len(points)} points already in {out_dir}, "
              f"{len(todo)} to run", flush=True)
    harness = Harness(cfg, guard, the_variant)
    progress = Progress(len(todo), is_root)
    rows, status = [], "complete"
    try:
        for w in sorted({p.world for p in todo}):
            guard.arm(f"creating the world-{w} communicator")
            comm = backend.split(w)
            if comm is not None:
                comm.node_of_rank = nodes[:w]  # for per-tier (scale-up / scale-out) accounting
            for point in (p for p in todo if p.world == w):
                if comm is None:
                    continue
                point_rows = harness.run_point(comm, point)
                if is_root:
                    for r in point_rows:
                        add_ceiling(r, profile, nodes)
                        writer.append(r)
                    rows.extend(point_rows)
                    progress.update(point, point_rows)
            # Ranks outside world w wait here for the others, as long as the sweep takes.
            guard.disarm()
            world.idle_barrier()
    except BaseException as e:  # keep finished rows, mark the run, then let it end the process
        guard.disarm()
        status = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
        progress.close()
        if writer:
            writer.meta["variants"][the_variant.name]["status"] = status
            writer.finish(status, f"{type(e).__name__}: {e} at {harness.where or 'start-up'}")
        raise
    guard.arm("finishing")
    progress.close()
    failed = [r for r in rows if r["check"] == "fail"]
    if writer:
        writer.meta["variants"][the_variant.name]["status"] = "complete" if not failed else "check_failed"
        writer.finish(overall_status(writer.meta["variants"]),
                      f"{len(failed)} point(s) failed the data check" if failed else None)
        from .report import analysis_tables, print_tables

        print_tables(rows)
        analysis_tables(rows)
        print(f"results: {writer.dir}", flush=True)
        if failed:
            print(f"error: {len(failed)} point(s) failed the data check", file=sys.stderr, flush=True)
    bad = world.max_over_ranks(np.array([1.0 if failed else 0.0]))[0] > 0
    guard.stop()
    backend.finalize()
    return 1 if bad else 0


def add_ceiling(row: dict, profile, nodes: list[int]) -> None:
    """The row's tier, ceiling and % of it (ceilings.ceiling_for_row), under the profile's name."""
    from . import ceilings

    if profile is None:
        row.update({k: None for k in ceilings.CEILING_KEYS}, profile=None)
        return
    row.update(ceilings.ceiling_for_row(profile, row, nodes), profile=profile.name)


def _cfg_dict(cfg) -> dict:
    from dataclasses import asdict

    return asdict(cfg)
