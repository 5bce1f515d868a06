#!/usr/bin/env python3
"""Every GPU path one GPU allows, in one short run (under 5 minutes on one H200).

Steps, each a subprocess (the real CLI where it is a commbench run), each reported as
PASS, SKIP (with why) or FAIL (with a one-line reason) without stopping the others:

  list          `commbench list`: which benchmarks and backends this build has
  nccl-events   nccl world 1, CUDA-event timing, 5 collectives, 8 B .. 64 MiB
  nccl-graph    the same with --cuda-graph (graph replays: small messages lose the launch)
  mpi-cupy      backend mpi with cupy buffers (CUDA-aware MPI), world 1, CUDA events
  overlap       the overlap benchmark (collective beside a GPU matrix multiply), if built
  hbm           device-to-device copy bandwidth (commbench.gpuprobe) beside h200-hgx's HBM

Then a table: the 8 B all_reduce p50 of events vs graph (the graph's should be lower),
the 64 MiB p50 and busbw of every collective, and the HBM figures. Each step's output is
kept in DIR/<step>.log, each run in DIR/<step>/, the summary in DIR/summary.json.

Usage: python tools/gpu_check.py [--out DIR] [--step-timeout S]
       (DIR defaults to results/gpu-check-<stamp>)

Exit status: 0 every step passed or was skipped; 1 a step failed; 3 no CUDA device (one
line, "no CUDA device: nothing to check", and nothing run) -- 3, not 0, so that CI on a
GPU-less runner never reads "nothing checked" as a pass.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NO_CUDA_LINE = "no CUDA device: nothing to check"
EXIT_NO_CUDA = 3
BENCHES = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]
# 8 B to 64 MiB by 8x, and 64 MiB itself (the 8x range stops at 16 MiB).
SIZES = "8,64,512,4K,32K,256K,2M,16M,64M"
BIG = 64 << 20


class Skip(Exception):
    """A step that cannot run here, and why."""


class Failed(Exception):
    """A step that ran and failed; the message is its one-line reason."""


def one_line(text: str, limit: int = 160) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def run_cmd(argv: list[str], log: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run in its own session (mpirun's ranks die with it on a timeout), output to `log`."""
    env = dict(os.environ)
    env.pop("COMMBENCH_TTY", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        log.write_text(f"$ {' '.join(argv)}\n{out}\n--- stderr ---\n{err}\n--- timed out after {timeout:.0f} s\n")
        raise Failed(f"timed out after {timeout:.0f} s (log: {log})")
    log.write_text(f"$ {' '.join(argv)}\n{out}\n--- stderr ---\n{err}\n--- exit {proc.returncode}\n")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def exit_reason(cp: subprocess.CompletedProcess) -> str:
    rc = cp.returncode
    why = one_line(cp.stderr) or one_line(cp.stdout) or "no output"
    if rc < 0 or rc in (134, 139):
        why = f"crashed ({'signal ' + str(-rc) if rc < 0 else 'exit ' + str(rc)}): {why}"
    else:
        why = f"exit {rc}: {why}"
    return why


def read_rows(run_dir: Path) -> list[dict]:
    f = run_dir / "rows.jsonl"
    if not f.is_file():
        return []
    rows = []
    for line in f.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def figures(rows: list[dict]) -> dict:
    """{benchmark: {nbytes: (p50 us, algbw GB/s, busbw GB/s)}} of a run's rows."""
    out: dict = {}
    for r in rows:
        out.setdefault(r.get("benchmark"), {})[int(r.get("nbytes", 0))] = (
            r.get("time_us_p50"), r.get("algbw_gbps"), r.get("busbw_gbps"))
    return out


def check_rows(rows: list[dict], want_clock: str | None) -> None:
    if not rows:
        raise Failed("the run wrote no rows")
    bad = [r for r in rows if r.get("check") == "fail"]
    if bad:
        raise Failed(f"{len(bad)} row(s) failed the result check, e.g. {bad[0].get('benchmark')} "
                     f"{bad[0].get('nbytes')} B")
    if want_clock:
        other = sorted({str(r.get("clock")) for r in rows} - {want_clock})
        if other:
            raise Failed(f"rows timed with clock {other[0]}, expected {want_clock}")


def fmt_us(x) -> str:
    return "-" if x is None else f"{x:.2f} us" if x < 1000 else f"{x / 1000:.3g} ms"


def fmt_gbps(x) -> str:
    return "-" if x is None else f"{x:.1f} GB/s"


class Check:
    def __init__(self, out: Path, step_timeout: float):
        self.out, self.timeout = out, step_timeout
        self.benchmarks: list[str] = []
        self.data: dict = {}

    def cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "commbench", *args]

    # --- steps ------------------------------------------------------------------
    def step_list(self) -> str:
        cp = run_cmd(self.cli("list"), self.out / "list.log", self.timeout)
        if cp.returncode:
            raise Failed(exit_reason(cp))
        names, section = [], None
        for line in cp.stdout.splitlines():
            if line and not line.startswith(" "):
                section = line.strip().rstrip(":")
            elif section == "benchmarks" and line.strip():
                names.append(line.split()[0])
        self.benchmarks = names
        nccl = [ln.strip() for ln in cp.stdout.splitlines() if ln.strip().startswith("nccl ")]
        return f"{len(names)} benchmarks; {nccl[0] if nccl else 'nccl not listed'}"

    def _run(self, name: str, extra: list[str], want_clock: str | None, backend: str = "nccl") -> dict:
        run_dir = self.out / name
        cp = run_cmd(self.cli("run", "quick", "--np", "1", "--backend", backend, "-b", ",".join(BENCHES),
                              "--worlds", "1", "--sizes", SIZES, "--out", str(run_dir), *extra),
                     self.out / f"{name}.log", self.timeout)
        if cp.returncode:
            raise Failed(exit_reason(cp))
        rows = read_rows(run_dir)
        check_rows(rows, want_clock)
        fig = figures(rows)
        self.data[name] = fig
        return fig

    def _summary(self, fig: dict) -> str:
        small = fig.get("all_reduce", {}).get(8, (None,))[0]
        big = fig.get("all_reduce", {}).get(BIG, (None, None))
        return f"all_reduce 8 B p50 {fmt_us(small)}; 64 MiB p50 {fmt_us(big[0])}, algbw {fmt_gbps(big[1])}"

    def step_nccl_events(self) -> str:
        return self._summary(self._run("nccl-events", [], "cuda_event"))

    def step_nccl_graph(self) -> str:
        fig = self._run("nccl-graph", ["--cuda-graph"], "cuda_graph")
        text = self._summary(fig)
        ev = self.data.get("nccl-events", {}).get("all_reduce", {}).get(8, (None,))[0]
        gr = fig.get("all_reduce", {}).get(8, (None,))[0]
        if ev is not None and gr is not None:
            text += f"; 8 B graph/events {gr / ev:.2f}x" + ("" if gr < ev else " (NOT lower: look)")
        return text

    def step_mpi_cupy(self) -> str:
        import importlib.util

        for mod, why in (("cupy", "cupy is not importable (pip install cupy-cuda12x)"),
                         ("mpi4py", "mpi4py is not importable")):
            if importlib.util.find_spec(mod) is None:
                raise Skip(why)
        # --np 1: commbench starts the rank under mpirun itself (launch.mpirun_command).
        return self._summary(self._run("mpi-cupy", ["--device", "cuda"], "cuda_event", backend="mpi"))

    def step_overlap(self) -> str:
        if "overlap" not in self.benchmarks:
            raise Skip("overlap benchmark not available in this build")
        run_dir = self.out / "overlap"
        cp = run_cmd(self.cli("run", "quick", "--np", "1", "--backend", "nccl", "-b", "overlap", "--worlds", "1",
                              "--sizes", "1M,64M", "--out", str(run_dir)), self.out / "overlap.log", self.timeout)
        if cp.returncode == 2 and "needs" in (cp.stderr + cp.stdout):
            raise Skip(one_line(cp.stderr or cp.stdout))
        if cp.returncode:
            raise Failed(exit_reason(cp))
        rows = read_rows(run_dir)
        check_rows(rows, None)
        self.data["overlap"] = figures(rows)
        return f"{len(rows)} rows"

    def step_hbm(self) -> str:
        code = ("import json; from commbench.gpuprobe import hbm_copy_gbps; from commbench.ceilings import "
                "load_profile; print(json.dumps({'copy_gbps': hbm_copy_gbps(), "
                "'h200_hbm_gbps': load_profile('h200-hgx').hbm_gbps}))")
        cp = run_cmd([sys.executable, "-c", code], self.out / "hbm.log", self.timeout)
        if cp.returncode:
            raise Failed(exit_reason(cp))
        d = json.loads(cp.stdout.strip().splitlines()[-1])
        self.data["hbm"] = d
        copy, spec = d["copy_gbps"], d["h200_hbm_gbps"]
        text = f"copy {copy:.0f} GB/s copied = {2 * copy:.0f} GB/s read+write"
        if spec:
            text += f"; h200-hgx HBM {spec:.0f} GB/s (read+write): {200 * copy / spec:.0f}%"
        return text


def run_steps(steps) -> list[tuple[str, str, str]]:
    """(name, PASS|SKIP|FAIL, text) per step; a step's failure never stops the next."""
    results = []
    for name, fn in steps:
        t0 = time.monotonic()
        try:
            status, text = "PASS", fn()
        except Skip as e:
            status, text = "SKIP", str(e)
        except Failed as e:
            status, text = "FAIL", str(e)
        except Exception as e:  # noqa: BLE001 - any failure is one step's FAIL
            status, text = "FAIL", f"{type(e).__name__}: {one_line(e)}"
        text = f"{text} [{time.monotonic() - t0:.0f} s]"
        print(f"{name:12s} {status:4s}  {text}", flush=True)
        results.append((name, status, text))
    return results


def print_figures(data: dict) -> None:
    runs = [r for r in ("nccl-events", "nccl-graph", "mpi-cupy") if r in data]
    if not runs:
        return
    print(f"\n{'world 1: p50 (and algbw)':28s}" + "".join(f"{r:>26s}" for r in runs))
    for b in BENCHES:
        for nbytes, label in ((8, "8 B"), (BIG, "64 MiB")):
            cells = []
            for r in runs:
                p50, algbw, _ = data[r].get(b, {}).get(nbytes, (None, None, None))
                cells.append(fmt_us(p50) if nbytes == 8 else f"{fmt_us(p50)} {fmt_gbps(algbw)}")
            print(f"  {b:15s} {label:>8s}  " + "".join(f"{c:>26s}" for c in cells))
    print("  (world 1: algbw = bytes / time; busbw is 0 for most collectives at one rank)")


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="result directory (default results/gpu-check-<stamp>)")
    ap.add_argument("--step-timeout", type=float, default=150.0, help="seconds per step (default 150)")
    args = ap.parse_args(argv)
    if not cuda_available():
        print(NO_CUDA_LINE)
        return EXIT_NO_CUDA
    out = Path(args.out or f"results/gpu-check-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    chk = Check(out, args.step_timeout)
    print(f"gpu check: {out}", flush=True)
    results = run_steps([("list", chk.step_list), ("nccl-events", chk.step_nccl_events),
                         ("nccl-graph", chk.step_nccl_graph), ("mpi-cupy", chk.step_mpi_cupy),
                         ("overlap", chk.step_overlap), ("hbm", chk.step_hbm)])
    print_figures(chk.data)
    failed = [n for n, s, _ in results if s == "FAIL"]
    (out / "summary.json").write_text(json.dumps(
        {"steps": [{"step": n, "status": s, "text": t} for n, s, t in results],
         "figures": {k: ({b: {str(n): v for n, v in d.items()} for b, d in v.items()} if k != "hbm" else v)
                     for k, v in chk.data.items()}}, indent=2, default=str) + "\n")
    print(f"\n{'FAILED: ' + ', '.join(failed) if failed else 'all steps passed or skipped'} ({out})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
