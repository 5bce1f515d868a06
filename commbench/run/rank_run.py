"""THE harness: setup -> check -> warm-up (calibration) -> timed iterations -> row, and the
run of a suite on one rank as a few named steps (start, open the run, sweep, finish)."""
from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from commbench import backends
from commbench.analyse import ceilings
from commbench.analyse.ceilings import add_ceiling
from commbench.analyse.profiles import Profile, default_profile_name
from commbench.backends import control, mpi_timeloop, probe, rendezvous
from commbench.benchmarks import get
from commbench.core import hoststate
from commbench.core.errors import RunFailed, UsageError
from commbench.core.schema import point_key
from commbench.core.whoami import detect, node_ids, world_mismatch
from commbench.report.progress import Progress
from commbench.report.terminal import analysis_tables, print_tables
from commbench.report.viewsettings import View, from_argv
from commbench.report.warnings_view import say_warnings
from commbench.run.contract import held_by_my_launcher, launch_id_or_new, repeat_upto, say_marked
from commbench.run.guard import Guard, teardown_bound
from commbench.run.plan import point_seconds
from commbench.run.point_harness import Harness, describe_point, repeat_suffix
from commbench.run.spec import RunSpec, check_nodes, refuse_disagreement
from commbench.run.suite import SuiteConfig
from commbench.run.variants import Variant, lookup
from commbench.store.lock import RunLock
from commbench.store.record import RunRecord, Status
from commbench.store.results import RunDir

if TYPE_CHECKING:  # the backends' classes import their libraries (torch, mpi4py, jax)
    from commbench.backends.base import Comm
    from commbench.backends.jax_dist import JaxBackend
    from commbench.backends.mpi import MpiBackend
    from commbench.backends.torch_backend import TorchBackend

    Backend = MpiBackend | TorchBackend | JaxBackend

# The loopback probe's share of the watchdog's budget (memcpy and latency, at the start).
PROBE_BUDGET_S = 30.0

# Rank 0 writes results.csv and prints the run's tables at the end while the other ranks wait
# for it in the last agreement: no communication, but on a busy host (pandas and rich
# imported, a long sweep's analysis) it can outlast a short --timeout, which is meant for one.
TABLES_BUDGET_S = 60.0


def resolve_profile(spec: RunSpec, comm, device: str, gpu_names: list[str]) -> tuple[Profile | None, dict]:
    """The profile rows are compared with: the spec's (loaded with its overrides when it was
    built), else the device's; the loopback one is measured here (collective). Returns
    (profile or None, meta dict)."""

    cfg, overrides = spec.config, spec.profile_overrides
    name = cfg.profile or default_profile_name(device, gpu_names)
    if name is None:
        return None, {"profile": None, "note": "no profile for this GPU: pass --profile"}
    prof = spec.profile or ceilings.apply_overrides(ceilings.load_profile(name), overrides or {})
    # Built once at the end: the profile's part of meta.json, which the record writes.
    said = {"profile": prof.name, "chosen": "given" if cfg.profile else "default"}
    if prof.measured:
        m = probe.loopback_probe(comm)
        said = {**said, "probe": m}
        if m.get("latency_us") is None:
            m["latency_us"] = 0.0
        prof = ceilings.loopback_profile(m["memcpy_in_cache_gbps"], m["memcpy_beyond_cache_gbps"],
                                         m["llc_nbytes"], m["latency_us"])
        if m.get("memcpy_beyond_cache_spread_pct") is not None:  # the caption's tier says how steady it was
            prof = replace(prof, scaleup_link=f"{prof.scaleup_link}, line rate the median of {probe.PROBES} probes "
                                              f"(spread {m['memcpy_in_cache_spread_pct']:.0f} % in cache, "
                                              f"{m['memcpy_beyond_cache_spread_pct']:.0f} % beyond)")
        # A probe that waited for a CPU or spread too far carries no verdict (ceilings.probe_doubt).
        prof = replace(prof, scaleup_in_cache_doubt=ceilings.probe_doubt(m, "in_cache"),
                       scaleup_doubt=ceilings.probe_doubt(m, "beyond_cache"))
        prof = ceilings.apply_overrides(prof, overrides or {})  # the probe's rates, then the flags' over them
    return prof, {**said, "fields": asdict(prof)}


# --- one rank's run of a suite, in named steps ---------------------------------------------

@dataclass
class RunContext:
    """What the steps of a run share on one rank."""

    spec: RunSpec
    variant: Variant
    backend: Backend
    world: Comm
    guard: Guard
    hosts: list
    nodes: list
    profile: Profile | None
    prof_meta: dict
    run_dir: RunDir | None  # rank 0 only
    points: list = field(default_factory=list)  # the sweep, expanded once in this process (session)
    notes: list = field(default_factory=list)  # what the expansion dropped or rounded
    todo: list = field(default_factory=list)
    reps: list = field(default_factory=list)  # the repeat (1..repeat) of each todo entry
    repeat: int = 1  # `run --repeat N`: each point N times, interleaved
    cores: list = field(default_factory=list)  # each world rank's cores (hoststate.cores)
    host_start: dict = field(default_factory=dict)  # hoststate.snapshot() at the start (rank 0)
    lock: RunLock | None = None  # rank 0 under an external launcher: the run directory's one-writer lock
    launch_id: str = ""  # this launch's; meta.json carries it beside every status rank 0 writes
    said: list = field(default_factory=list)  # lines the points left (the pairs verdict), said again at the end

    @property
    def is_root(self) -> bool:
        return self.world.rank == 0

    @property
    def cfg(self) -> SuiteConfig:
        return self.spec.config

    @property
    def backend_name(self) -> str:
        return self.spec.backend


def run(spec: RunSpec, points: list, notes: list[str], argv: list[str], variant: str = "default",
        join: bool = False, resume: bool = False) -> int:
    """Run the spec's sweep (points, notes: its expansion) on this rank, inside a launch, for
    one variant; returns the exit status. resume: the spec's out holds an unfinished run of
    this suite; its finished points are skipped. join: it may hold this suite's run for other
    variants: add to it."""
    ctx = start(spec, variant, join or resume, points)
    ctx.points, ctx.notes = points, notes
    try:
        open_run(ctx, argv, spec.ranks_per_node, spec.profile_overrides, resume)
    except Exception as e:  # a run directory that cannot be written (a full disk), say
        fail(ctx, e, "opening the run", None)
    record_control(ctx, "start")
    rows = sweep(ctx)
    return finish(ctx, rows, from_argv(argv))


# The control measurement's share of the watchdog's budget (about 0.35 s of fixed work).
CONTROL_BUDGET_S = 30.0


def record_control(ctx: RunContext, when: str) -> None:
    """The host's speed beside this launch (backends/control.py), measured by every rank
    and recorded by rank 0 in meta.json's `controls` (store/controls.py): at the start,
    after the ranks met and before the sweep; at the end, after the sweep and before the
    run is marked. compare reads them to tell a moved host from a changed code."""
    ctx.guard.arm(f"the control measurement ({when} of the launch)", CONTROL_BUDGET_S)
    try:
        unix_s = time.time()
        entry = control.measure(ctx.world)
        if ctx.is_root:
            ctx.run_dir.record.add_control({"launch": ctx.launch_id, "variant": ctx.variant.name,
                                      "repeat": repeat_upto(ctx.repeat), "when": when, "unix_s": unix_s, **entry})
    except BaseException as e:  # noqa: BLE001 (as the sweep: mark the run, keep its rows)
        fail(ctx, e, f"the control measurement ({when})", None)


def fail(ctx: RunContext, e: BaseException, where: str, progress) -> None:
    """This rank's run ends on e: say it in one line, keep the finished rows, mark the run,
    tell the other ranks (they stop now, not at the watchdog), then end the process."""

    ctx.guard.disarm()
    status = Status.INTERRUPTED if isinstance(e, KeyboardInterrupt) else Status.FAILED
    if progress is not None:
        progress.close()
    cause = f"{type(e).__name__}: {e} at {where}"
    if status == Status.FAILED:
        print(f"commbench: error: rank {ctx.world.rank}: {cause}", file=sys.stderr, flush=True)
    rd = ctx.run_dir
    if rd is not None and rd.meta:
        try:  # the record marks the variant this launch runs with the run
            rd.finish(status, f"rank 0: {cause}")
        except OSError as w:  # a full disk: the others must still hear of it below
            print(f"commbench: error: rank 0: could not mark the run: {w}", file=sys.stderr, flush=True)
        # Marked with the real cause: the stop the others' exit brings must not re-mark it.
        ctx.guard.on_fatal = None
    if status == Status.FAILED:
        ctx.guard.report_failure(cause)
        raise RunFailed(cause) from e
    raise e


def start(spec: RunSpec, variant_name: str, reuse_ceiling: bool, points: list = ()) -> RunContext:
    """Variant settings into the environment, the backend up, the ranks agreed on one spec,
    the watchdog armed, the hosts grouped into nodes and the ceiling profile chosen."""

    cfg, backend_name = spec.config, spec.backend
    variant = lookup(cfg, variant_name)
    # Before the library starts: NCCL and MPI read their settings once, at initialisation.
    os.environ.update(variant.env)
    info = detect()
    if backend_name in ("gloo", "nccl"):
        rendezvous.prepare_torch_env(info)
    backend = backends.create(backend_name, spec.device)
    backend.rendezvous_s = cfg.timeout_s  # start-up waits no longer than the run's --timeout
    world = backend.init(info)
    if backend_name == "mpi":
        # An MPI that cannot see the launcher's job makes each process a world of 1: refused,
        # or a job of N ranks would run (and be recorded) as N runs of one.
        why = world_mismatch(info, world.size)
        if why:

            raise UsageError(why)
    world.in_place = cfg.in_place
    # Every rank names a directory under an external launcher; rank 0's is the run's.
    spec = replace(spec, out=world.allgather_obj(spec.out)[0])
    agree(spec, world)
    out_dir = spec.out
    # One id for this launch (its launcher's, under `run --np`), so failure files and the
    # status of an earlier launch into the same directory (a resume) are not taken for this one's.
    token = world.allgather_obj(launch_id_or_new())[0]
    if world.rank == 0:  # every rank is up and has met: the launcher's start-up bound is met
        say_marked("started", out_dir)
    lock = _lock_run_dir(world, out_dir)
    guard = Guard(world.rank, world.size, out_dir, cfg.timeout_s, launch=token)
    guard.start()
    guard.arm("start-up")
    hosts = world.allgather_obj(socket.gethostname())
    nodes = node_ids(hosts, spec.ranks_per_node)
    try:  # every rank has the same hosts: all refuse at once (rank 0 says it), before any measurement
        check_nodes(points, nodes)
    except UsageError:
        guard.stop()
        raise
    cores = world.allgather_obj(hoststate.cores())
    if world.rank == 0:  # said before anything is measured, not only in the report afterwards
        over = hoststate.oversubscription_line(hoststate.ranks_per_core(hosts, cores), hosts, cores)
        if over:
            print(f"warning: {over}", file=sys.stderr, flush=True)
    # The probe's own work (memcpy for ~0.3 s, 2,100 exchanges) runs beyond --timeout on a
    # busy host; it is not what the watchdog is for.
    guard.arm("loopback probe", PROBE_BUDGET_S)
    # A run that other launches add to (variants, resume) keeps the ceiling it was judged by.
    prior = (RunDir(out_dir).read_meta().get("ceilings") if world.rank == 0 and reuse_ceiling else None)
    prior = world.allgather_obj(prior)[0]
    if prior and prior.get("fields"):
        profile = ceilings.profile_from_fields(prior["fields"], f"{out_dir}/meta.json: ceilings")
        prof_meta = prior
    else:
        profile, prof_meta = resolve_profile(spec, world, backend.device, backend.gpu_names())
    rd = RunDir(out_dir) if world.rank == 0 else None
    if rd is not None:
        # The launcher's drain bound starts when the run is marked.
        rd.on_marked = lambda d=out_dir: say_marked("marked", d)
        if RunRecord.read_spec(out_dir) != spec.to_dict():  # `run --np`'s launcher wrote it already
            rd.record.write_spec(spec.to_dict())
    return RunContext(spec, variant, backend, world, guard, hosts, nodes, profile, prof_meta, rd, lock=lock,
                      launch_id=token, cores=cores, repeat=spec.repeat,
                      host_start=hoststate.snapshot() if world.rank == 0 else {})


def agree(spec: RunSpec, world: Comm) -> None:
    """Under an external launcher each rank built the spec from its own command line (a
    launcher's ranks read one): every rank must have rank 0's, or every rank refuses the
    launch, naming the first field that differs."""
    digests = world.allgather_obj(spec.digest())
    if len(set(digests)) > 1:
        specs = world.allgather_obj(spec.to_dict())
        first = next(i for i, d in enumerate(digests) if d != digests[0])
        refuse_disagreement(specs[0], specs[first], first)


def _lock_run_dir(world, out_dir):
    """Rank 0 takes the run directory's lock unless its own launcher holds it (`run --np`);
    every rank learns the outcome, so a directory another run is writing is refused by all
    ranks at once, before anything is written."""

    lock, why = None, None
    if world.rank == 0 and not held_by_my_launcher(out_dir):
        try:
            lock = RunLock(out_dir).acquire()
        except (UsageError, OSError) as e:
            why = str(e)
    why = world.allgather_obj(why)[0]
    if why:
        raise UsageError(why)
    return lock


def open_run(ctx: RunContext, argv, ranks_per_node, profile_overrides, resume: bool) -> None:
    """Rank 0 opens the run directory (new, resumed or joined) and every rank learns which
    points are still to run."""
    cfg, world, backend = ctx.cfg, ctx.world, ctx.backend
    points, notes = ctx.points, ctx.notes
    done: set = set()
    if ctx.is_root:
        rd = ctx.run_dir
        rec = rd.record
        rec.read()  # nothing, or only the spec its launcher wrote, for a new run
        if rec.is_open_run():
            done = rd.done_keys() | rec.skipped_keys()  # a skipped point is done: not asked again
            rec.reopen(argv, resume)
        else:
            rec.open_new(argv, suite=cfg.name, config=_cfg_dict(cfg), backend=ctx.backend_name,
                         device=backend.device, world=world.size, launcher=detect().launcher, hosts=ctx.hosts,
                         nodes=ctx.nodes, ranks_per_node=ranks_per_node,
                         node_grouping="ranks_per_node" if ranks_per_node else "hostname",
                         rendezvous={k.lower(): os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT",
                                                                        "GLOO_SOCKET_IFNAME")
                                     if ctx.backend_name in ("gloo", "nccl") and os.environ.get(k)},
                         gpus=backend.gpu_names(), points=len(points), repeat=ctx.repeat,
                         ceilings=ctx.prof_meta, profile_overrides=profile_overrides or {})
            rpc = hoststate.ranks_per_core(ctx.hosts, ctx.cores)
            rec.set_host_state({
                "cores": {h: ctx.cores[ctx.hosts.index(h)] for h in rpc}, "ranks_per_core": rpc,
                "oversubscribed": any(x > 1.0 for x in rpc.values()),
                "start": {k: v for k, v in ctx.host_start.items() if k in ("load_avg", "at")},
                "gpu": hoststate.gpu_state(backend.device),
                "thresholds": {"wait_pct": hoststate.WAIT_PCT, "steal_pct": hoststate.STEAL_PCT}})
            rec.add_versions(backend.versions())
            if ctx.backend_name == "mpi" and backend.device == "cpu":
                mpi_timeloop.load(world.MPI)
                rec.set_timing_loop(mpi_timeloop.status())
        # From here on the status in meta.json is this launch's: the launcher learns so from
        # the launch itself (contract.say_marked "opened"), and meta.json records which launch it is.
        v = ctx.variant
        rec.open_launch(ctx.launch_id, v.name, env=v.env, inswitch=v.inswitch, description=v.description)
        rd.open()
        say_marked("opened", rd.dir)

        def on_fatal(status, reason, rd=rd):  # the record marks this launch's variant with the run
            rd.finish(status, reason)
        ctx.guard.on_fatal = on_fatal
        for n in notes:
            print(f"note: {n}", flush=True)
    done = set(world.allgather_obj(sorted(done))[0])
    # Repeats interleaved: every point once, then every point again, so a slow minute of the
    # host lands on one repeat of many points rather than on every repeat of one point. A
    # placement the backend cannot give (torch's all_reduce is in place only) makes both
    # placements one point: measured once.
    ctx.todo, ctx.reps, seen, n_done = [], [], set(done), 0
    for rep in range(1, repeat_upto(ctx.repeat) + 1):
        for p in points:
            key = point_key(p.benchmark, p.world, p.nbytes, p.dtype, p.params, ctx.variant.name,
                            get(p.benchmark).placement(world, p)) + repeat_suffix(rep)
            n_done += key in done
            if key not in seen:
                seen.add(key)
                ctx.todo.append(p)
                ctx.reps.append(rep)
    if ctx.is_root and resume:
        print(f"resume: {n_done} of {n_done + len(ctx.todo)} points already in {ctx.run_dir.dir}, "
              f"{len(ctx.todo)} to run", flush=True)


def sweep(ctx: RunContext) -> list[dict]:
    """Every point still to run, world by world; rank 0 judges each row against the ceiling
    and appends it as soon as the point is done. A failure keeps the finished rows and marks
    the run before it ends the process."""
    harness = Harness(ctx.cfg, ctx.guard, ctx.variant)
    progress = Progress(ctx.todo, ctx.is_root, lambda p: point_seconds(ctx.cfg, p))
    rows: list[dict] = []
    try:
        for w in sorted({p.world for p in ctx.todo}):
            ctx.guard.members = w
            ctx.guard.arm(f"creating the world-{w} communicator")
            comm = ctx.backend.split(w)
            harness.ranks_per_core = max(hoststate.ranks_per_core(ctx.hosts[:w], ctx.cores[:w]).values())
            if comm is not None:
                comm.in_place = ctx.cfg.in_place
                comm.node_of_rank = ctx.nodes[:w]  # for per-tier (scale-up / scale-out) accounting
                for point, rep in ((p, r) for p, r in zip(ctx.todo, ctx.reps) if p.world == w):
                    harness.repeat = rep
                    why = get(point.benchmark).skip_reason(comm, point)
                    if why:  # every rank says the same (the comm's facts): none sets up
                        skip_point(ctx, comm, point, rep, why)
                        progress.skipped(point)
                        continue
                    point_rows = harness.run_point(comm, point)
                    if ctx.is_root:
                        for r in point_rows:
                            add_ceiling(r, ctx.profile, ctx.nodes)
                            r["launch"] = ctx.launch_id  # repeats in fresh launches: told apart by it
                        ctx.run_dir.append_point(point_rows)
                        keep_results(ctx, harness.take_kept())
                        rows.extend(point_rows)
                        progress.update(point, point_rows)
            # Ranks outside world w wait here for the others, as long as the sweep takes.
            ctx.guard.idle(f"waiting for ranks 0-{w - 1} to finish world {w}" if comm is None
                           else f"world {w} done, waiting for the other ranks")
            ctx.guard.members = ctx.world.size
            ctx.world.idle_barrier()
    except BaseException as e:  # keep finished rows, mark the run, then let it end the process
        fail(ctx, e, harness.where or "start-up", progress)
    progress.close()
    return rows


def keep_results(ctx: RunContext, kept: dict) -> None:
    """What a point left beside its rows (Harness.keep): files in the run directory, meta
    entries, and lines said now (their indented details too) and again at the end of the run."""
    for name, text in kept["files"].items():
        ctx.run_dir.write_file(name, text)
    if kept["meta"]:
        ctx.run_dir.record.note_results(kept["meta"])
    for line in kept["lines"]:
        print(line, flush=True)
    ctx.said.extend(x for x in kept["lines"] if not x.startswith(" "))  # the end repeats the headlines


def skip_point(ctx: RunContext, comm, point, rep: int, why: str) -> None:
    """A point that cannot run here: rank 0 says so in one line and records it (no rows)."""
    if ctx.is_root:
        key = point_key(point.benchmark, point.world, point.nbytes, point.dtype, point.params, ctx.variant.name,
                        get(point.benchmark).placement(comm, point)) + repeat_suffix(rep)
        bench = get(point.benchmark)  # the params that tell the point from the default one
        own = " ".join(f"{k}={v}" for k, v in point.params.items() if k not in bench.params
                       or v != bench.params[k].default)
        what = f"{point.benchmark} {own} world {point.world}" if own else describe_point(point)
        print(f"skipped: {what}: {why}", flush=True)
        ctx.run_dir.record.point_skipped(key, point.benchmark, point.params, why)


def finish(ctx: RunContext, rows: list[dict], view: View = View()) -> int:
    """Mark the run, print its tables (rank 0) as `view` says, and close the backend. Exit
    status 1 when a point failed its data check on any rank."""
    record_control(ctx, "end")
    ctx.guard.arm("finishing", TABLES_BUDGET_S)
    failed = [r for r in rows if r["check"] == "fail"]
    rd = ctx.run_dir
    if rd is not None:
        # The status is the truth about every row of the variant, not only this launch's: a
        # resumed run keeps the failed checks of the launches before it.
        failed = failed_checks(rd.rows(), ctx.variant.name)
        earlier = len(failed) - sum(r["check"] == "fail" for r in rows)
        why = (f"{len(failed)} point(s) failed the data check"
               + (f" ({earlier} of them in an earlier launch of this run)" if earlier else "")) if failed else None
        # Repeats each a launch of their own: until the last one comes the variant is
        # unfinished, so a launcher that dies in between leaves a run that --resume completes.
        rd.record.repeat_done(ctx.variant.name, repeat_upto(ctx.repeat), ctx.repeat, check_failed=bool(failed))
        if ctx.host_start:  # each variant is a launch of its own into the run: counted each
            rd.record.note_host_over_run(ctx.variant.name, hoststate.over_run(ctx.host_start, hoststate.snapshot()),
                                         sum(1 for r in rows if r.get("disturbed")))
        rd.finish(None, why)  # the run's status: its variants'

        # The run is marked and its rows are whole: a rank that hangs from here on (in the
        # last agreement or the backend's teardown) must not re-mark it failed; the watchdog
        # still ends the process, and meta.json says why beside the status it keeps.
        def on_late_fatal(status, reason, rd=rd):
            rd.record.note_teardown(reason)
        ctx.guard.on_fatal = on_late_fatal

        print_tables(rows, view=view)
        # Worlds the launch chose (none named): a run of one says why it has no scaling table.
        analysis_tables(rows, say_no_scaling=ctx.cfg.worlds is None, view=view)
        say_warnings(rows, verbose=view.verbose)
        for line in ctx.said:
            print(line, flush=True)
        print(f"results: {rd.dir}", flush=True)
        if failed:
            print(f"error: {why}", file=sys.stderr, flush=True)
        # Rank 0 is done with the tables: the last agreement alone is left, and a rank frozen
        # before it is found at the timeout.
        ctx.guard.arm("finishing")
    bad = ctx.world.max_over_ranks(np.array([1.0 if failed else 0.0]))[0] > 0
    # MPI_Finalize and a process group's teardown wait for the other ranks: watched too.
    ctx.guard.arm("closing the backend")
    with teardown_bound(ctx.cfg.timeout_s + 10.0):
        ctx.backend.finalize()
    ctx.guard.stop()
    return 1 if bad else 0


def failed_checks(run_rows: list[dict], variant: str) -> list[dict]:
    """The rows of one variant of a run (all its launches) whose data check failed."""
    return [r for r in run_rows if (r.get("variant") or "default") == variant and r.get("check") == "fail"]


def _cfg_dict(cfg) -> dict:
    from dataclasses import asdict

    return asdict(cfg)
