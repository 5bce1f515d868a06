"""`run --np N` over several variants: each one is its own launch (NCCL and MPI read their
settings once per process), all adding to one run directory; variants that cannot run here
are recorded as skipped with the reason, and what the library says it used is recorded and
checked against what the variant asked for."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

from . import launch
from .variants import nccl_algorithms, ompi_selected_component, requested_ompi_component, unavailable


def mpi_flavor() -> str:
    try:
        out = subprocess.run([launch.find_mpirun(), "--version"], capture_output=True, text=True, timeout=30).stdout
    except Exception:  # noqa: BLE001 (no mpirun: not an MPI run)
        return ""
    if "Open MPI" in out or "prte" in out.lower():
        return "Open MPI"
    return "MPICH" if ("HYDRA" in out or "MPICH" in out) else out.strip().splitlines()[0] if out.strip() else ""


def ompi_component_probe(np_: int, env: dict) -> str:
    """Ask Open MPI, in a short launch with the variant's settings and coll_base_verbose, which
    coll component it selects for MPI_COMM_WORLD."""
    code = "from mpi4py import MPI; MPI.COMM_WORLD.Barrier()"
    cmd = launch.mpirun_command(np_, [])[:-2] + ["-c", code]  # mpirun ... python -c CODE
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                           env={**os.environ, **env, "OMPI_MCA_coll_base_verbose": "100"})
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


def run_variants(variants, np_: int, backend: str, device: str, child_argv: list[str], out: str, cfg) -> int:
    flavor = mpi_flavor() if backend == "mpi" else ""
    caps = {}
    if device == "cuda":
        # NVLS and CollNet availability only shows when NCCL runs: try them, and let the
        # recorded algorithm (NCCL's debug file) say whether they were used.
        from .backends.torch_dist import symm_mem_support

        why = symm_mem_support()
        caps = {"nvls": True, "collnet": True, "symm_mem": True if why is None else why}
    skipped, library, status = {}, {}, 0
    for v in variants:
        why = unavailable(v, backend, device, flavor, caps)
        if why:
            print(f"variant {v.name}: skipped: {why}", flush=True)
            skipped[v.name] = why
            continue
        env = dict(v.env)
        if backend == "nccl":  # NCCL writes which algorithm it picked to a file per process
            env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="TUNING",
                       NCCL_DEBUG_FILE=f"{out}/nccl-debug-{v.name}.%h.%p.log")
        shown = " ".join(f"{k}={x}" for k, x in v.env.items()) or "(no settings)"
        print(f"variant {v.name}: {v.description}: {shown}", flush=True)
        rc = launch.spawn_local(np_, backend, child_argv + ["--variant", v.name], out_dir=out, extra_env=env)
        library[v.name] = library_report(v, backend, np_, out)
        if library[v.name].get("mismatch"):
            print(f"variant {v.name}: asked for {library[v.name]['asked']} but the library used "
                  f"{library[v.name]['used']}", flush=True)
        status = status or rc
        if rc == 130:
            break
    _finish_meta(out, cfg, skipped, library)
    if Path(out, "rows.jsonl").is_file():
        from .report import variant_tables
        from .results import load

        variant_tables(load(out), cfg.baseline)  # skipped ones were announced above
    return status


def record_skip(out: str, name: str, why: str, cfg) -> None:
    """A variant an external launch could not run, recorded in the run it belongs to."""
    _finish_meta(out, cfg, {name: why}, {})


def _finish_meta(out: str, cfg, skipped: dict, library: dict) -> None:
    from .results import base_meta, write_csv
    from .runner import overall_status

    path = Path(out) / "meta.json"
    Path(out).mkdir(parents=True, exist_ok=True)
    meta = json.loads(path.read_text()) if path.is_file() else {**base_meta(sys.argv[1:]), "suite": cfg.name}
    vs = meta.setdefault("variants", {})
    for name, why in skipped.items():
        vs[name] = {"status": "skipped", "reason": why}
    for name, lib in library.items():
        vs.setdefault(name, {"status": "failed", "reason": "the launch ended before rank 0 recorded it"})["library"] = lib
    if meta.get("status") != "interrupted":
        meta["status"] = overall_status(vs) if any(v.get("status") != "skipped" for v in vs.values()) else "complete"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(meta, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    if Path(out, "rows.jsonl").is_file():
        write_csv(Path(out))
