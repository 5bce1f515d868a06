"""`run --np N` over several variants: each one is its own launch (NCCL and MPI read their
settings once per process), all adding to one run directory; variants that cannot run here
are recorded as skipped with the reason, and what the library says it used is recorded and
checked against what the variant asked for."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
from pathlib import Path

from commbench.backends.torch_backend import symm_mem_support
from commbench.report import shootout_view
from commbench.report.terminal import variant_tables
from commbench.report.viewsettings import from_argv
from commbench.run.variants import lookup
from commbench.store.load import load, names_for
from commbench.store.record import Status
from commbench.store.results import RunDir, load_meta

from . import contract, launcher, stops
from .variants import nccl_algorithms, ompi_selected_component, requested_ompi_component


def mpi_flavor() -> str:
    try:
        out = launcher.mpirun_banner(launcher.find_mpirun())
    except Exception:  # noqa: BLE001 (no mpirun: not an MPI run)
        return ""
    if "Open MPI" in out or "prte" in out.lower():
        return "Open MPI"
    return "MPICH" if ("HYDRA" in out or "MPICH" in out) else out.strip().splitlines()[0] if out.strip() else ""


def ompi_component_probe(np_: int, env: dict) -> str:
    """Ask Open MPI, in a short launch with the variant's settings and coll_base_verbose, which
    coll component it selects for MPI_COMM_WORLD."""
    code = "from mpi4py import MPI; MPI.COMM_WORLD.Barrier()"
    cmd = launcher.mpirun_command(np_, [])[:-2] + ["-c", code]  # mpirun ... python -c CODE
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                           env=launcher.local_mpi_env({**os.environ, **env, "OMPI_MCA_coll_base_verbose": "100"}))
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return p.stdout + p.stderr


def library_report(v, backend: str, np_: int, out: str) -> dict:
    """What the library says it used, and whether that is what the variant asked for."""
    if backend == "mpi" and requested_ompi_component(v.env):
        want = requested_ompi_component(v.env)
        got = ompi_selected_component(ompi_component_probe(np_, v.env))
        return {"asked": f"coll/{want}", "used": f"coll/{got}" if got else None, "scope": "MPI_COMM_WORLD",
                "mismatch": bool(got and got != want)}
    if backend == "nccl" and v.expect.get("nccl_algo"):
        logs = "".join(Path(f).read_text(errors="replace") for f in glob.glob(f"{out}/nccl-debug-{v.name}.*"))
        used = sorted(nccl_algorithms(logs))
        want = v.expect["nccl_algo"]
        return {"asked": want, "used": used or None, "mismatch": bool(used) and want not in used}
    return {}


def capabilities(backend: str, device: str, probe: bool = True) -> tuple[str, dict]:
    """What variants.plan needs to know about this host: the MPI flavour (mpi backend) and,
    on GPUs, the in-switch capabilities. NVLS and CollNet only show when NCCL runs, so they
    are tried, and the recorded algorithm (NCCL's debug file) says whether they were used;
    probe=False (a rank inside an external launch) takes symmetric memory on trust too."""
    flavor = mpi_flavor() if backend == "mpi" else ""
    caps = {}
    if device == "cuda":
        why = None
        if probe:
            why = symm_mem_support()
        caps = {"nvls": True, "collnet": True, "symm_mem": True if why is None else why}
    return flavor, caps


def run_variants(vplan, np_: int, backend: str, child_argv: list[str], out: str, cfg, repeat: int = 1) -> int:
    """Launch each runnable variant of the plan (variants.plan) on np_ local ranks, one
    launch each, into one run directory; then the side-by-side report. repeat: the run's
    `--repeat N`; with several variants they then alternate repeat by repeat."""
    skipped, library, status = {}, {}, 0
    runnable = []
    for v, why in vplan.entries:
        if why:
            print(f"variant {v.name}: skipped: {why}", flush=True)
            skipped[v.name] = why
        else:
            runnable.append(v)
    # With repeats, every repeat is a launch of its own, and several variants alternate
    # repeat by repeat (A B A B ...): a slow stretch of the host then lands on one repeat of
    # each variant, not on every repeat of one. Why a launch each: what a process keeps for
    # its life -- where the MPI library's shared-memory segment landed, which cores its ranks
    # got -- can hold a point at one of several speeds for the whole process (on a 2-core VM a
    # float32 16 KiB all_reduce ran at 7.8 us in some launches and 10.2 us in others, every
    # repeat alike); repeats in one process would all share it, as repeats in fresh ones do
    # not (pyperf runs its benchmarks in many worker processes for the same reason).
    rounds = range(1, repeat + 1) if repeat > 1 and runnable else [None]
    with stops.noting_stops():  # a signal between two launches stops the run as one inside a launch does
        for v, rep in ((v, rep) for rep in rounds for v in runnable):
            if stops.stopped_by() is not None:  # Ctrl-C, SIGTERM or SIGHUP: no further launch
                break
            env = dict(v.env)
            if rep is not None:
                env[contract.REPEAT_UPTO_ENV] = str(rep)
            if backend == "nccl":  # NCCL writes which algorithm it picked to a file per process
                env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="TUNING",
                           NCCL_DEBUG_FILE=f"{out}/nccl-debug-{v.name}.%h.%p.log")
            shown = " ".join(f"{k}={x}" for k, x in v.env.items()) or "(no settings)"
            if len(vplan.entries) > 1:
                print(f"variant {v.name}{f' (repeat {rep} of {repeat})' if rep else ''}: {v.description}: {shown}",
                      flush=True)
            elif rep:
                print(f"repeat {rep} of {repeat}: a launch of its own", flush=True)
            rc = launcher.spawn_local(np_, backend, child_argv + ["--variant", v.name], out_dir=out, extra_env=env,
                                    timeout_s=cfg.timeout_s, variant=v.name)
            if v.name not in library and stops.stopped_by() is None:
                library[v.name] = library_report(v, backend, np_, out)
                if library[v.name].get("mismatch"):
                    print(f"variant {v.name}: asked for {library[v.name]['asked']} but the library used "
                          f"{library[v.name]['used']}", flush=True)
            status = status or rc
    stop = stops.stopped_by()
    _finish_meta(out, cfg, skipped, library, [v.name for v in runnable] if stop is not None else [], stop)
    if Path(out, "rows.jsonl").is_file():
        if vplan.note:
            print(f"note: {vplan.note}", flush=True)
        df = load(out)
        ran = set(df["variant"]) if "variant" in df else set()
        # skipped ones were announced above; a baseline that did not run leaves the choice to the report
        if len(vplan.entries) > 1:  # one variant (a plain run with repeats): its launches printed its tables
            variant_tables(df, vplan.baseline if vplan.baseline in ran else None, view=from_argv(child_argv))
        if repeat > 1:  # the shoot-out's verdicts rest on every repeat: said once they all ran
            for line in shootout_view.terminal_lines(df, {name: load_meta(out) for name in names_for([out])}):
                print(line, flush=True)
    return stops.exit_status(stop) if stop is not None else status


def resume_variants(cfg, names: list[str], np_: int, backend: str, child_argv: list[str], out: str,
                    one_named: bool) -> int:
    """--resume --np N of a run of several variants: each unfinished one in its own launch
    (with its settings in the environment, as the first launch had them)."""

    status = 0
    with stops.noting_stops():
        for name in names:
            if stops.stopped_by() is not None:  # Ctrl-C, SIGTERM or SIGHUP: no further launch
                break
            child = child_argv + ([] if one_named else ["--variant", name])
            status = launcher.spawn_local(np_, backend, child, out_dir=out, extra_env=lookup(cfg, name).env,
                                        timeout_s=cfg.timeout_s, variant=name) or status
    stop = stops.stopped_by()
    if stop is not None:
        _finish_meta(out, cfg, {}, {}, names, stop)
    return stops.exit_status(stop) if stop is not None else status


def record_skip(out: str, name: str, why: str, cfg) -> None:
    """A variant an external launch could not run, recorded in the run it belongs to."""
    _finish_meta(out, cfg, {name: why}, {})


def _finish_meta(out: str, cfg, skipped: dict, library: dict, planned=(), stop: int | None = None) -> None:
    """The launcher's record of the variants: skipped ones with their reason, what the
    library said it used, and the run's status from its variants'. stop: the signal that
    stopped the launcher, which leaves every planned variant not finished, and the run,
    interrupted."""

    rd = RunDir(out)
    rec = rd.record
    rec.read()
    if not rec.is_open_run():  # no launch opened the run: its record starts here
        rec.open_new(sys.argv[1:], suite=cfg.name)
    for name, why in skipped.items():
        rec.variant_skipped(name, why)
    if stop is not None and planned:
        rec.launcher_stopped(planned, stop)
    for name, lib in library.items():
        rec.note_library(name, lib)
    if rec.status != Status.INTERRUPTED:
        rec.settle()
    rec.write()
    if rd.holds_run():
        rd.write_csv()
