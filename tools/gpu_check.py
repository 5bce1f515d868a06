#!/usr/bin/env python3
"""Every GPU path one GPU allows, in one short run (under 5 minutes on one H200).

Steps, each a subprocess (the real CLI where it is a commbench run), each reported as
PASS, SKIP (with why) or FAIL (with a one-line reason) without stopping the others:

  list          `commbench list`: which benchmarks and backends this build has
  nccl-held     nccl world 1, the default timing (held batches: device time only), 5
                collectives, 8 B .. 64 MiB; all_reduce out of place (cupy's NCCL)
  nccl-in-place the in-place all_reduce (torch.distributed's own)
  nccl-unheld   COMMBENCH_NO_HOLD=1: events on an idle stream, the host's launch cost inside
  nccl-per-op   --per-op-events: an event pair per operation inside held batches
  nccl-graph    --cuda-graph, held replays, out of place and in place
  host-loop     torch.distributed's host cost per call by a perf_counter loop, beside the
                rows' host_us_per_op
  refusals      two ranks on one GPU; CUDA buffers on a non-CUDA-aware MPI: one line, exit 2
  mpi-cupy      backend mpi with cupy buffers, when the MPI is CUDA-aware
  inswitch      the inswitch suite on nccl (its baseline is nccl-ring there)
  moe           moe at world 1 on nccl, checks on
  overlap       the overlap benchmark (collective beside a GPU matrix multiply), if built
  hbm           device-to-device copy bandwidth (commbench.backends.gpuprobe) beside h200-hgx's HBM

Then the figures beside nccl-tests' on the same H200 (shared/reference/gpu-h200.md), as
ratios, with the targets they must meet. Each step's output is kept in DIR/<step>.log,
each run in DIR/<step>/, the summary in DIR/summary.json.

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

# nccl-tests 2.19.6 on one H200, world 1, float sum (shared/reference/gpu-h200.md), us:
# all_reduce per size: (eager out-of-place, eager in-place, -G out-of-place, -G in-place).
REF_ALL_REDUCE = {8: (4.64, 0.22, 0.98, 0.02), 64: (4.62, 0.22, 1.13, 0.01), 512: (4.38, 0.22, 1.27, 0.01),
                  4 << 10: (4.55, 0.21, 1.25, 0.01), 32 << 10: (4.48, 0.20, 1.36, 0.01),
                  256 << 10: (4.51, 0.28, 1.44, 0.01), 2 << 20: (4.62, 0.24, 3.03, 0.01),
                  16 << 20: (11.10, 0.22, 10.00, 0.01), 64 << 20: (34.88, 0.43, None, None)}
REF_HOST_US = (22.0, 29.0)  # torch.distributed's host cost per call there (perf_counter loop)


class Skip(Exception):
    """A step that cannot run here, and why."""


class Failed(Exception):
    """A step that ran and failed; the message is its one-line reason."""


def one_line(text: str, limit: int = 160) -> str:
    lines = [ln.strip() for ln in str(text).strip().splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= limit else line[:limit - 3] + "..."


def run_cmd(argv: list[str], log: Path, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run in its own session (mpirun's ranks die with it on a timeout), output to `log`."""
    env = {**os.environ, **(env or {})}
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

    def _run(self, name: str, extra: list[str], want_clock: str | None, backend: str = "nccl",
             benches: list[str] | None = None, env: dict | None = None) -> dict:
        run_dir = self.out / name
        cp = run_cmd(self.cli("run", "quick", "--np", "1", "--backend", backend, "-b", ",".join(benches or BENCHES),
                              "--worlds", "1", "--sizes", SIZES, "--out", str(run_dir), *extra),
                     self.out / f"{name}.log", self.timeout, env=env)
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

    def step_nccl_held(self) -> str:
        fig = self._run("nccl-held", [], "cuda_event_held")
        return self._summary(fig) + self._host_text("nccl-held")

    def step_nccl_in_place(self) -> str:
        fig = self._run("nccl-in-place", ["--in-place"], "cuda_event_held", benches=["all_reduce"])
        return self._summary(fig)

    def step_nccl_unheld(self) -> str:
        fig = self._run("nccl-unheld", [], "cuda_event", benches=["all_reduce", "all_gather"],
                        env={"COMMBENCH_NO_HOLD": "1"})
        held = self.data.get("nccl-held", {}).get("all_reduce", {}).get(8, (None,))[0]
        text = self._summary(fig)
        un = fig.get("all_reduce", {}).get(8, (None,))[0]
        if held and un:
            text += f"; 8 B unheld/held {un / held:.1f}x"
        return text

    def step_nccl_per_op(self) -> str:
        return self._summary(self._run("nccl-per-op", ["--per-op-events"], "cuda_event_held",
                                       benches=["all_reduce", "all_gather"]))

    def step_nccl_graph(self) -> str:
        fig = self._run("nccl-graph", ["--cuda-graph"], "cuda_graph")
        self._run("nccl-graph-in-place", ["--cuda-graph", "--in-place"], "cuda_graph", benches=["all_reduce"])
        return self._summary(fig)

    def step_host_loop(self) -> str:
        code = ("import os, time, torch, torch.distributed as dist; os.environ.setdefault('MASTER_ADDR', '127.0.0.1'); "
                "os.environ.setdefault('MASTER_PORT', '29555'); torch.cuda.set_device(0); "
                "dist.init_process_group('nccl', rank=0, world_size=1, device_id=torch.device('cuda', 0)); "
                "x = torch.zeros(2, device='cuda'); [dist.all_reduce(x) for _ in range(50)]; torch.cuda.synchronize(); "
                "t0 = time.perf_counter(); [dist.all_reduce(x) for _ in range(500)]; t1 = time.perf_counter(); "
                "torch.cuda.synchronize(); print((t1 - t0) / 500 * 1e6); dist.destroy_process_group()")
        cp = run_cmd([sys.executable, "-c", code], self.out / "host-loop.log", self.timeout)
        if cp.returncode:
            raise Failed(exit_reason(cp))
        loop = float(cp.stdout.strip().splitlines()[-1])
        self.data["host-loop"] = {"perf_counter_us_per_call": loop}
        return f"perf_counter loop {loop:.1f} us a call" + self._host_text("nccl-in-place")

    def _host_text(self, run: str) -> str:
        rows = read_rows(self.out / run)
        host = sorted(r["host_us_per_op"] for r in rows if r.get("host_us_per_op") is not None
                      and r.get("benchmark") == "all_reduce")
        return f"; rows' host_us_per_op (all_reduce) {host[0]:.1f}-{host[-1]:.1f} us" if host else ""

    def step_refusals(self) -> str:
        said = []
        cp = run_cmd(self.cli("run", "quick", "--np", "2", "--backend", "nccl", "-b", "all_reduce", "--sizes", "8"),
                     self.out / "refusal-two-ranks.log", self.timeout)
        lines = (cp.stderr or "").strip().splitlines()
        if cp.returncode != 2 or len(lines) != 1:
            raise Failed(f"two ranks on one GPU: exit {cp.returncode}, {len(lines)} stderr line(s): {one_line(cp.stderr)}")
        said.append(lines[0][-70:])
        cp = run_cmd(self.cli("run", "quick", "--np", "2", "--backend", "mpi", "--device", "cuda", "-b", "all_reduce",
                              "--sizes", "8"), self.out / "refusal-mpi-cuda.log", self.timeout)
        lines = (cp.stderr or "").strip().splitlines()
        if cp.returncode == 0:
            said.append("mpi+cuda ran: this MPI says it is CUDA-aware")
        elif cp.returncode != 2 or len(lines) != 1:
            raise Failed(f"mpi+cuda: exit {cp.returncode}, {len(lines)} stderr line(s): {one_line(cp.stderr)}")
        else:
            said.append(lines[0][-70:])
        return " | ".join(said)

    def step_inswitch(self) -> str:
        run_dir = self.out / "inswitch"
        cp = run_cmd(self.cli("run", "inswitch", "--np", "1", "--backend", "nccl", "--worlds", "1", "--sizes",
                              "8,1M,64M", "--out", str(run_dir)), self.out / "inswitch.log", self.timeout * 2)
        if cp.returncode:
            raise Failed(exit_reason(cp))
        rows = read_rows(run_dir)
        check_rows(rows, None)
        return f"{len(rows)} rows, variants {', '.join(sorted({r.get('variant') for r in rows}))}"

    def step_moe(self) -> str:
        """moe at world 1 on nccl, checks on: normal mode at the full DeepSeek-V3 shape (T=4096,
        H=7168, top-8 of 256, fp8) with the stage times and bytes beside the HBM copy rate, and
        the low-latency mode at the decode shape (T=128), held."""
        out = []
        for name, extra in (("moe", ["--param", "copies=rank,expert"]),
                            ("moe-ll", ["--param", "tokens=128", "--param", "copies=expert",
                                        "--param", "mode=low_latency"])):
            run_dir = self.out / name
            cp = run_cmd(self.cli("run", "moe", "--np", "1", "--backend", "nccl", "--worlds", "1", "--check",
                                  *extra, "--out", str(run_dir)), self.out / f"{name}.log", self.timeout)
            if cp.returncode:
                raise Failed(f"{name}: {exit_reason(cp)}")
            rows = read_rows(run_dir)
            check_rows(rows, None)
            self.data[name] = rows
            for r in rows:
                stages = " ".join(f"{k[9:]}={v:.0f}" for k, v in r.items() if k.startswith("stage_us_"))
                out.append(f"{name} {r['params'].get('copies')} {r.get('stage')} {fmt_us(r.get('time_us_p50'))} "
                           f"[{stages}]")
        return "; ".join(out)

    def step_mpi_cupy(self) -> str:
        import importlib.util

        for mod, why in (("cupy", "cupy is not importable (pip install cupy-cuda12x)"),
                         ("mpi4py", "mpi4py is not importable")):
            if importlib.util.find_spec(mod) is None:
                raise Skip(why)
        sys.path.insert(0, str(ROOT))
        from commbench.backends.gpus import mpi_cuda_support

        aware, how = mpi_cuda_support(os.path.dirname(sys.executable))
        if not aware:
            raise Skip(f"this MPI is not CUDA-aware ({how}): the refusal is checked in `refusals`")
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
        code = ("import json; from commbench.backends.gpuprobe import hbm_copy_gbps; from commbench.analyse.ceilings import "
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


def p50(data: dict, run: str, bench: str, nbytes: int):
    return data.get(run, {}).get(bench, {}).get(nbytes, (None,))[0]


def reference_lines(data: dict) -> list[tuple[str, str]]:
    """(line, verdict) for each target of the GPU timing against nccl-tests' figures."""
    out = []

    def judge(text, ok):
        out.append((text, "n/a" if ok is None else ("PASS" if ok else "MISS")))
    small = [n for n in REF_ALL_REDUCE if n <= 256 << 10]
    rat = [p50(data, "nccl-held", "all_reduce", n) for n in small]
    if all(r is not None for r in rat):
        worst = max(r / REF_ALL_REDUCE[n][2] for r, n in zip(rat, small))
        judge(f"held out-of-place all_reduce 8 B-256 KiB: worst {worst:.2f}x nccl-tests -G (target <= 2x)", worst <= 2)
    ip = [p50(data, "nccl-in-place", "all_reduce", n) for n in REF_ALL_REDUCE]
    if all(r is not None for r in ip):
        judge(f"held in-place all_reduce: max {max(ip):.2f} us (target < 1 us)", max(ip) < 1.0)
    for n in (16 << 20, 64 << 20):
        r = p50(data, "nccl-held", "all_reduce", n)
        if r is not None:
            ref = REF_ALL_REDUCE[n][0]
            judge(f"held all_reduce {n >> 20} MiB: {r:.2f} us vs {ref} ({r / ref - 1:+.1%}, target within 5 %)",
                  abs(r / ref - 1) <= 0.05)
    # In place the -G reference is ~0.01 us (a no-op at world 1): shown, not judged as a ratio.
    ratios = [p50(data, "nccl-graph", "all_reduce", n) / ref[2] for n, ref in REF_ALL_REDUCE.items()
              if ref[2] and p50(data, "nccl-graph", "all_reduce", n) is not None]
    if ratios:
        judge(f"--cuda-graph out-of-place: worst {max(ratios):.2f}x nccl-tests -G (target <= 1.25x)", max(ratios) <= 1.25)
    host = data.get("host-loop", {}).get("perf_counter_us_per_call")
    if host is not None:
        judge(f"host cost: perf_counter loop {host:.1f} us a call (reference {REF_HOST_US[0]:g}-{REF_HOST_US[1]:g})",
              None)
    return out


def moe_rates(rows: list[dict], copy_gbps: float | None) -> list[str]:
    """The device path's own work beside the HBM copy rate (issue target: at least half):
    layout + pack + unpack move the dispatched rows once each way (received rows, the most
    loaded rank's logical bytes, both into and out of the send and receive tables), the
    combine reduce reads the returned rows."""
    out = []
    for r in rows:
        p50 = {k[9:]: v for k, v in r.items() if k.startswith("stage_us_")}
        moved = float(r.get("logical_nbytes") or 0)
        if r.get("stage") == "dispatch":
            t = sum(p50.get(k, 0.0) for k in ("layout", "pack", "unpack"))
            what = "layout+pack+unpack"
        else:
            t = p50.get("reduce", 0.0)
            what = "reduce"
        if t > 0 and moved > 0:
            gbps = moved / (t * 1e3)
            ratio = f" = {gbps / copy_gbps:.2f} of the HBM copy rate {copy_gbps:.0f} GB/s" if copy_gbps else ""
            out.append(f"moe {r['params'].get('copies')} {r['stage']}: {what} {t:.1f} us for {moved / 1e6:.1f} MB: "
                       f"{gbps:.0f} GB/s{ratio}")
    return out


def print_figures(data: dict) -> None:
    for line in moe_rates(data.get("moe", []), (data.get("hbm") or {}).get("copy_gbps")):
        print(f"  {line}")
    runs = [r for r in ("nccl-held", "nccl-in-place", "nccl-unheld", "nccl-per-op", "nccl-graph",
                        "nccl-graph-in-place") if r in data]
    if not runs:
        return
    print("\nall_reduce p50 (us), world 1, beside nccl-tests on one H200 (eager oop / in-place, -G oop / in-place)")
    print(f"{'size':>8s}" + "".join(f"{r:>20s}" for r in runs) + f"{'nccl-tests':>30s}")
    for n, ref in REF_ALL_REDUCE.items():
        cells = [p50(data, r, "all_reduce", n) for r in runs]
        print(f"{n:>8d}" + "".join(f"{'-' if c is None else f'{c:.2f}':>20s}" for c in cells)
              + f"{' / '.join('-' if x is None else f'{x:g}' for x in ref):>30s}")
    for text, verdict in reference_lines(data):
        print(f"  {verdict:4s} {text}")


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
    results = run_steps([("list", chk.step_list), ("nccl-held", chk.step_nccl_held),
                         ("nccl-in-place", chk.step_nccl_in_place), ("nccl-unheld", chk.step_nccl_unheld),
                         ("nccl-per-op", chk.step_nccl_per_op), ("nccl-graph", chk.step_nccl_graph),
                         ("host-loop", chk.step_host_loop), ("refusals", chk.step_refusals),
                         ("mpi-cupy", chk.step_mpi_cupy), ("inswitch", chk.step_inswitch), ("moe", chk.step_moe),
                         ("overlap", chk.step_overlap), ("hbm", chk.step_hbm)])
    print_figures(chk.data)
    failed = [n for n, s, _ in results if s == "FAIL"]
    (out / "summary.json").write_text(json.dumps(
        {"steps": [{"step": n, "status": s, "text": t} for n, s, t in results],
         "figures": {k: ({b: {str(n): v for n, v in d.items()} for b, d in v.items()}
                         if k.startswith("nccl") or k == "mpi-cupy" else v) for k, v in chk.data.items()}}, indent=2, default=str) + "\n")
    print(f"\n{'FAILED: ' + ', '.join(failed) if failed else 'all steps passed or skipped'} ({out})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
