"""THE harness: setup -> check -> warm-up (calibration) -> timed iterations -> row."""
from __future__ import annotations

import socket
import sys

import numpy as np

from . import backends, launch, suite as suite_mod
from .benchmarks import get
from .report import stdout_is_tty
from .results import SCHEMA_VERSION, RunWriter, base_meta
from .stats import bandwidths_gbps, calibrate_iters, summarize_us


def node_ids(hosts: list[str], ranks_per_node: int | None) -> list[int]:
    """Node of each rank: by hostname, or rank // ranks_per_node to model two tiers on one host."""
    if ranks_per_node:
        return [r // ranks_per_node for r in range(len(hosts))]
    order: dict[str, int] = {}
    return [order.setdefault(h, len(order)) for h in hosts]


class Harness:
    def __init__(self, cfg: suite_mod.SuiteConfig):
        self.cfg = cfg

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
        comm.barrier()
        warm = timer(op, max(cfg.warmup, 0 if cfg.iters else 1))
        if cfg.iters:
            iters = cfg.iters
        else:
            # Every rank must run the same count: agree on the slowest rank's estimate.
            est = float(comm.max_over_ranks(np.array([np.median(warm)]))[0])
            iters = calibrate_iters(est, cfg.min_time_ms / 1e3, cfg.min_iters, cfg.max_iters)
        comm.barrier()
        times = comm.max_over_ranks(timer(op, iters))
        stats = summarize_us(times)
        algbw, busbw = bandwidths_gbps(traffic.nbytes, stats["time_us_p50"], traffic.busbw_factor)
        return {"stage": stage, "iters": iters, "warmup": cfg.warmup, "timing": cfg.timing, "clock": "cuda_graph" if cfg.cuda_graph else comm.timing_method,
                **stats, "algbw_gbps": algbw, "busbw_gbps": busbw, "busbw_factor": traffic.busbw_factor}

    def run_point(self, comm, point) -> list[dict]:
        bench = get(point.benchmark)
        bufs = bench.setup(comm, point)
        check = "skipped"
        bench.fill(comm, bufs)
        if self.cfg.check and bench.checks:
            bench.op(comm, bufs)()
            comm.sync()
            ok = bench.check(comm, bufs)
            check = "ok" if comm.min_over_ranks(np.array([1.0 if ok else 0.0]))[0] > 0 else "fail"
        frags = bench.measure(self, comm, point, bufs)
        base = {"schema": SCHEMA_VERSION, "benchmark": point.benchmark, "backend": comm.backend,
                "device": comm.device, "world": point.world, "nbytes": point.nbytes, "dtype": point.dtype,
                "variant": "default", "params": point.params}
        return [{**base, **frag, "check": frag.get("check", check)} for frag in frags]


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


def run(cfg: suite_mod.SuiteConfig, backend_name: str, device: str | None, out_dir, argv: list[str],
        ranks_per_node: int | None = None, profile_overrides: dict | None = None) -> int:
    """Run a validated suite on this rank (inside a launch); returns the exit status."""
    info = launch.detect()
    points, notes = suite_mod.expand(cfg, info.world, backends.BACKEND_DTYPES[backend_name])
    if backend_name in ("gloo", "nccl"):
        launch.prepare_torch_env(info)
    backend = backends.create(backend_name, device)
    world = backend.init(info)
    is_root = world.rank == 0
    hosts = world.allgather_obj(socket.gethostname())
    nodes = node_ids(hosts, ranks_per_node)
    profile, prof_meta = resolve_profile(cfg, profile_overrides, world, backend.device, backend.gpu_names())
    writer = None
    if is_root:
        meta = base_meta(argv)
        meta.update({"suite": cfg.name, "config": _cfg_dict(cfg), "backend": backend_name,
                     "device": backend.device, "world": world.size, "launcher": info.launcher,
                     "hosts": hosts, "nodes": nodes, "ranks_per_node": ranks_per_node,
                     "gpus": backend.gpu_names(), "points": len(points), "ceilings": prof_meta})
        meta["versions"].update(backend.versions())
        writer = RunWriter(out_dir, meta)
        for n in notes:
            print(f"note: {n}", flush=True)
    harness = Harness(cfg)
    progress = Progress(len(points), is_root)
    rows, status = [], "complete"
    try:
        for w in sorted({p.world for p in points}):
            comm = backend.split(w)
            if comm is not None:
                comm.node_of_rank = nodes[:w]  # for per-tier (scale-up / scale-out) accounting
            for point in (p for p in points if p.world == w):
                if comm is None:
                    continue
                point_rows = harness.run_point(comm, point)
                if is_root:
                    for r in point_rows:
                        add_ceiling(r, profile, nodes)
                        writer.append(r)
                    rows.extend(point_rows)
                    progress.update(point, point_rows)
            world.idle_barrier()
    except BaseException as e:  # keep finished rows, mark the run, then let it end the process
        status = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
        progress.close()
        if writer:
            writer.finish(status, f"{type(e).__name__}: {e}")
        raise
    progress.close()
    failed = [r for r in rows if r["check"] == "fail"]
    if writer:
        writer.finish("complete" if not failed else "check_failed",
                      f"{len(failed)} point(s) failed the data check" if failed else None)
        from .report import analysis_tables, print_tables

        print_tables(rows)
        analysis_tables(rows)
        print(f"results: {writer.dir}", flush=True)
        if failed:
            print(f"error: {len(failed)} point(s) failed the data check", file=sys.stderr, flush=True)
    bad = world.max_over_ranks(np.array([1.0 if failed else 0.0]))[0] > 0
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
