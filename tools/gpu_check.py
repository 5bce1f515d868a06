#!/usr/bin/env python3
"""Every GPU path one GPU allows, in one short run: within a 6-minute budget (BUDGET_S),
counted from this script's start, its preflight imports included, and printed at the start.

Runs on the GPU machine as it is: the interpreter that runs this script (the machine's own
python3, or GPU_PY= through `make gpu-check`) runs the checkout in place (PYTHONPATH); no
venv, no pip, no network. Before any step, one line says what is missing if anything is
(no CUDA device, a CPU build of torch, numpy/pandas/rich/torch absent) and nothing runs.
Optional parts (cupy, mpi4py, a CUDA-aware MPI, a second GPU) are skipped with the reason.

Steps, each a subprocess (the real CLI where it is a commbench run), each in its own time
box (STEP_LIMIT_S; the boxes and PREFLIGHT_S add up to no more than BUDGET_S), reported as
PASS, SKIP (with why) or FAIL (with a one-line reason) without stopping the others:

  probe         what blocks the host behind a short hold here (barrier, first launch,
                cudaMalloc, cudaHostAlloc, host-to-device copies, the MoE stages' ops)
  list          `commbench list`: which benchmarks and backends this build has
  nccl-held     nccl world 1, held batches, 5 collectives, 8 B .. 64 MiB
  nccl-in-place the in-place all_reduce (torch.distributed's own)
  nccl-graph    --cuda-graph, held replays, out of place (cupy's NCCL, captured) and in place
  barrier       one nccl barrier point: never held, so never near the hold's cap
  moe           moe at world 1, checks on: normal mode at the DeepSeek-V3 shape, low-latency
                at the decode shape; both held
  hbm           device-to-device copy bandwidth beside h200-hgx's HBM
  host-loop     torch.distributed's host cost per call by a perf_counter loop
  nccl-unheld   COMMBENCH_NO_HOLD=1: events on an idle stream, the host's launch cost inside
  nccl-per-op   --per-op-events: an event pair per operation inside held batches
  refusals      two ranks on one GPU without the opt-in; CUDA buffers on a non-CUDA-aware
                MPI; TORCH_NCCL_BLOCKING_WAIT=1: one line, exit 2 each
  two-ranks     two ranks sharing the GPU (a distinct NCCL_HOSTID each, loopback): the gloo
                meeting while held, the expired-hold agreement, cupy's NCCL id broadcast,
                hierarchical MoE -- correctness and host paths only, not performance
  overlap       the overlap benchmark, if built
  inswitch      the inswitch suite on nccl, three variants (baseline nccl-ring)
  mpi-cupy      backend mpi with cupy buffers, when the MPI is CUDA-aware

Then one table: each target, what was measured, the reference (nccl-tests on the same H200,
shared/reference/gpu-h200.md), and PASS / MISS / SKIP (why) / INFO. Each step's output is
kept in DIR/<step>.log, each run in DIR/<step>/, the summary in DIR/summary.json; `--only
STEP,...` reruns the named steps into the same DIR, keeping the others' earlier results.

Usage: python tools/gpu_check.py [--out DIR] [--only STEP,...] [--budget S] [--step-timeout S]

Exit status: 0 every step passed or was skipped and no target missed; 1 a step failed or a
target missed; 2 bad arguments; 3 no CUDA device (one line, "no CUDA device: nothing to
check (why)", nothing run: 3, not 0, so that CI on a GPU-less runner never reads "nothing
checked" as a pass); 4 something required is missing (one line naming it).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

T0 = time.monotonic()  # the budget counts from here: the preflight's imports are in it

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_preflight  # noqa: E402,F401 (tests reach its module globals through here)
from gpu_preflight import EXIT_MISSING, EXIT_NO_CUDA, NO_CUDA_LINE, preflight, visible_gpus  # noqa: E402,F401
from gpu_targets import (  # noqa: E402,F401
    REF_ALL_REDUCE,
    Failed,
    Skip,
    barrier_verdict,
    check_rows,
    cupy_hint,
    exit_reason,
    figures,
    fmt_gbps,
    fmt_us,
    load_previous,
    moe_rates,
    one_line,
    print_figures,
    probe_summary,
    read_rows,
    table,
    targets,
    two_rank_text,
)

# The whole check ends within 6 minutes of its start (device time is short: room for a second
# run), the preflight's torch and cupy imports (5-20 s cold) included.
BUDGET_S = 360.0
PREFLIGHT_S = 30.0  # what the step boxes leave for the preflight
BENCHES = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]
# 8 B to 64 MiB by 8x, and 64 MiB itself (the 8x range stops at 16 MiB).
SIZES = "8,64,512,4K,32K,256K,2M,16M,64M"
BIG = 64 << 20


def run_cmd(argv: list[str], log: Path, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run in its own session (mpirun's ranks die with it on a timeout), output to `log`."""
    env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}  # None: unset
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


# Each step's own time box (seconds), in the order the steps run; with PREFLIGHT_S they add up
# to no more than BUDGET_S (tested), so no step is skipped for the budget when each fits its box.
# The whole check took about 35 s on one H200 (shared/reference/gpu-h200.md): the boxes are
# several times what a step needs, the first subprocess paying torch's cold import.
STEP_LIMIT_S = {"probe": 20, "list": 10, "nccl-held": 30, "nccl-in-place": 15, "nccl-graph": 30, "barrier": 10,
                "moe": 40, "hbm": 10, "host-loop": 15, "nccl-unheld": 15, "nccl-per-op": 15, "refusals": 20,
                "two-ranks": 50, "overlap": 15, "inswitch": 25, "mpi-cupy": 10}


class Check:
    def __init__(self, out: Path, step_timeout: float | None = None, budget_s: float = BUDGET_S,
                 env: dict | None = None, clock=time.monotonic, start: float | None = None):
        self.out, self.step_timeout, self.clock = out, step_timeout, clock
        self.budget_s = budget_s
        self.deadline = self.step_deadline = (clock() if start is None else start) + budget_s
        self.env = env or {}
        self.benchmarks: list[str] = []
        self.data: dict = {}

    def left(self) -> float:
        """Seconds left of the whole check's budget."""
        return self.deadline - self.clock()

    def start_step(self, name: str) -> None:
        limit = STEP_LIMIT_S.get(name, 60)
        if self.step_timeout:
            limit = min(limit, self.step_timeout)
        self.step_deadline = min(self.deadline, self.clock() + limit)

    @property
    def timeout(self) -> float:
        """What is left of the running step's time box: each command gets that much."""
        left = self.step_deadline - self.clock()
        if left < 1:
            raise Failed("its time box ran out")
        return left

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
        ran_out = [r for r in read_rows(self.out / "nccl-unheld") if "ran out" in str(r.get("unheld_reason"))]
        if ran_out:  # nothing holds here: no hold can have run out
            raise Failed(f"{len(ran_out)} COMMBENCH_NO_HOLD=1 row(s) say their hold ran out")
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
        cp = run_cmd([sys.executable, "-c", "from commbench.backends.gpuprobe import host_call_us; "
                      "print(host_call_us())"], self.out / "host-loop.log", self.timeout)
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

    def _refused(self, what: str, argv: list[str], log: str, env: dict | None = None) -> str:
        """A command that must be refused in one line, exit 2: the end of that line."""
        cp = run_cmd(argv, self.out / log, self.timeout, env=env)
        lines = (cp.stderr or "").strip().splitlines()
        if cp.returncode != 2 or len(lines) != 1:
            raise Failed(f"{what}: exit {cp.returncode}, {len(lines)} stderr line(s): {one_line(cp.stderr)}")
        return lines[0][-70:]

    def step_refusals(self) -> str:
        from commbench.backends.gpus import SHARED_GPU_ENV

        said = []
        if self.env.get("gpus", 1) == 1:  # without the opt-in, two ranks on one GPU stay refused
            said.append(self._refused("two ranks on one GPU", self.cli(
                "run", "quick", "--np", "2", "--backend", "nccl", "-b", "all_reduce", "--sizes", "8"),
                "refusal-two-ranks.log", env={SHARED_GPU_ENV: None}))
        said.append(self._refused("TORCH_NCCL_BLOCKING_WAIT=1", self.cli(
            "run", "quick", "--np", "1", "--backend", "nccl", "-b", "all_reduce", "--sizes", "8"),
            "refusal-blocking-wait.log", env={"TORCH_NCCL_BLOCKING_WAIT": "1"}))
        if importlib.util.find_spec("mpi4py") is None:
            return " | ".join(said + ["mpi+cuda not tried: mpi4py is not importable"])
        argv = self.cli("run", "quick", "--np", "2", "--backend", "mpi", "--device", "cuda", "-b", "all_reduce",
                        "--sizes", "8")
        try:
            said.append(self._refused("mpi+cuda", argv, "refusal-mpi-cuda.log"))
        except Failed:
            if not (self.out / "refusal-mpi-cuda.log").read_text().rstrip().endswith("--- exit 0"):
                raise
            said.append("mpi+cuda ran: this MPI says it is CUDA-aware")
        return " | ".join(said)

    def step_inswitch(self) -> str:
        """Three variants launched (the baseline nccl-ring, nccl-tree, the default; ompi-ring, the
        suite's mpi baseline, must be named and is skipped on nccl), one collective, three sizes,
        few iterations: each variant is a launch of its own (torch's import and NCCL's set-up, a
        few seconds), so the step fits its box on one GPU."""
        run_dir = self.out / "inswitch"
        cp = run_cmd(self.cli("run", "inswitch", "--np", "1", "--backend", "nccl", "--worlds", "1", "--variants",
                              "nccl-ring,nccl-tree,default,ompi-ring", "-b", "all_reduce", "--sizes", "8,1M,64M",
                              "--iters", "10", "--warmup", "2", "--out", str(run_dir)),
                     self.out / "inswitch.log", self.timeout)
        if cp.returncode:
            raise Failed(exit_reason(cp))
        rows = read_rows(run_dir)
        check_rows(rows, None)
        return f"{len(rows)} rows, variants {', '.join(sorted({str(r.get('variant')) for r in rows}))}"

    def step_probe(self) -> str:
        """What blocks the host behind a short hold on this machine (gpuprobe.run_probe)."""
        from commbench.backends.gpuprobe import PROBE_HOLD_S, probe_lines

        cp = run_cmd([sys.executable, "-c", "import json; from commbench.backends.gpuprobe import run_probe; "
                      "print(json.dumps(run_probe()))"], self.out / "probe.log", self.timeout)
        if cp.returncode:
            raise Failed(exit_reason(cp))
        rows = json.loads(cp.stdout.strip().splitlines()[-1])
        self.data["probe"] = rows
        for line in probe_lines(rows):
            print(f"  probe: {line}", flush=True)
        return probe_summary(rows, PROBE_HOLD_S)

    def step_barrier(self) -> str:
        """One nccl barrier point: never held (its wait() synchronizes the stream), so its p50
        must be nowhere near the hold's cap."""
        from commbench.backends.gpuhold import hold_cap_s

        run_dir = self.out / "barrier"
        cp = run_cmd(self.cli("run", "quick", "--np", "1", "--backend", "nccl", "-b", "barrier", "--worlds", "1",
                              "--iters", "20", "--warmup", "2", "--out", str(run_dir)), self.out / "barrier.log",
                     self.timeout)
        if cp.returncode:
            raise Failed(exit_reason(cp))
        rows = read_rows(run_dir)
        check_rows(rows, "cuda_event")
        r = rows[0]
        self.data["barrier"] = {"p50_us": r.get("time_us_p50"), "hold_method": r.get("hold_method")}
        return barrier_verdict(r, hold_cap_s())

    def step_two_ranks(self) -> str:
        """Two ranks sharing this GPU (gpus.shared_gpu_launch_env: a distinct NCCL_HOSTID each,
        NCCL and gloo on loopback): the multi-rank host paths, checks on, at a few sizes; the
        expired-hold agreement (a cap no batch fits in); hierarchical and flat MoE, small."""
        from commbench.backends.gpus import SHARED_GPU_MARK, shared_gpu_launch_env

        if self.env.get("gpus", 1) > 1:
            raise Skip(f"{self.env['gpus']} GPUs visible: two ranks do not have to share one here")
        env = shared_gpu_launch_env(2)
        runs = [("collectives", ["quick", "-b", "all_reduce,all_gather,broadcast,barrier", "--sizes", "8,64K,4M",
                                 "--check", "--iters", "5", "--warmup", "1"], {}),
                # a 10 us cap: no batch of torch's calls (22-29 us each) is enqueued within it
                ("expired", ["quick", "-b", "all_reduce", "--in-place", "--sizes", "8", "--iters", "5", "--warmup",
                             "1"], {"COMMBENCH_HOLD_CAP_S": "0.00001"}),
                ("moe", ["moe", "--ranks-per-node", "1", "--param", "path=flat,hierarchical", "--param", "tokens=256",
                         "--param", "hidden=1024", "--param", "experts=16", "--param", "topk=4", "--check",
                         "--iters", "3", "--warmup", "1"], {})]
        said = []
        for name, args, extra in runs:
            run_dir = self.out / "two-ranks" / name
            cp = run_cmd(self.cli("run", *args[:1], "--np", "2", "--backend", "nccl", "--worlds", "2", *args[1:],
                                  "--out", str(run_dir)),
                         self.out / f"two-ranks-{name}.log", self.timeout, env={**env, **extra})
            if cp.returncode:
                raise Failed(f"{name}: {exit_reason(cp)}")
            rows = read_rows(run_dir)
            check_rows(rows, None)
            self.data[f"two-ranks-{name}"] = rows
            said.append(two_rank_text(name, rows, self.env.get("cupy_ok", False)))
        for line in said:
            print(f"  {SHARED_GPU_MARK}: {line}", flush=True)
        return f"{SHARED_GPU_MARK}: " + "; ".join(said)

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
        for mod, why in (("cupy", f"cupy is not importable ({cupy_hint(self.env)})"),
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


def run_steps(steps, chk: Check | None = None) -> list[tuple[str, str, str]]:
    """(name, PASS|SKIP|FAIL, text) per step; a step's failure never stops the next. With a
    Check, each step runs in its time box, and a step the budget leaves no time for is
    skipped, saying so."""
    results = []
    for name, fn in steps:
        t0 = time.monotonic()
        if chk is not None and chk.left() < 5:
            status, text = "SKIP", f"the check's {chk.budget_s:.0f} s budget is spent"
        else:
            if chk is not None:
                chk.start_step(name)
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--out", help="result directory (default results/gpu-check-<stamp>)")
    ap.add_argument("--only", help="comma-separated steps to run (default all): " + ", ".join(STEP_LIMIT_S))
    ap.add_argument("--budget", type=float, default=BUDGET_S, help=f"seconds for the whole check (default {BUDGET_S:g})")
    ap.add_argument("--step-timeout", type=float, default=None, help="cap every step's own time box (seconds)")
    args = ap.parse_args(argv)
    only = [x.strip() for x in (args.only or "").split(",") if x.strip()]
    unknown = [x for x in only if x not in STEP_LIMIT_S]
    if unknown or (args.only is not None and not only):
        print(f"gpu_check: --only: unknown step(s) {', '.join(unknown) or '(none given)'} "
              f"(steps: {', '.join(STEP_LIMIT_S)})", file=sys.stderr)
        return 2
    if args.budget <= 0 or (args.step_timeout is not None and args.step_timeout <= 0):
        print("gpu_check: --budget and --step-timeout must be positive seconds", file=sys.stderr)
        return 2
    rc, line, env = preflight()
    if rc:
        print(line)
        return rc
    out = Path(args.out or f"results/gpu-check-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    before, data = load_previous(out) if only else ({}, {})
    chk = Check(out, args.step_timeout, args.budget, env, start=T0)
    chk.data.update(data)
    print(f"gpu check: budget {args.budget:.0f} s from start, {time.monotonic() - T0:.0f} s spent before the steps "
          f"(preflight); step boxes {sum(STEP_LIMIT_S.values())} s", flush=True)
    print(f"gpu check: {out} (torch {env.get('torch')}, CUDA {env.get('cuda')}, {env.get('gpus')} GPU(s); "
          f"{env.get('cupy')})", flush=True)
    steps = [(n, getattr(chk, "step_" + n.replace("-", "_"))) for n in STEP_LIMIT_S]
    if only and "list" not in only and any(n in only for n in ("overlap",)):
        only.insert(0, "list")  # overlap asks list which benchmarks this build has
    ran = run_steps([(n, fn) for n, fn in steps if not only or n in only], chk)
    done = {n: (s, t) for n, s, t in ran}
    results = [(n, *done[n]) if n in done else (n, *before[n]) for n, _ in steps if n in done or n in before]
    print_figures(chk.data)
    rows = targets(chk.data, env)
    print("\n" + table(results, rows))
    failed = [n for n, s, _ in results if s == "FAIL"]
    missed = [r[0] for r in rows if str(r[3]).startswith("MISS")]
    (out / "summary.json").write_text(json.dumps(
        {"steps": [{"step": n, "status": s, "text": t} for n, s, t in results], "env": env,
         "targets": [dict(zip(("target", "measured", "reference", "verdict"), r)) for r in rows],
         "data": {k: ({b: {str(n): v for n, v in d.items()} for b, d in v.items()}
                      if k.startswith("nccl") or k == "mpi-cupy" else v) for k, v in chk.data.items()}},
        indent=2, default=str) + "\n")
    verdict = [f"FAILED: {', '.join(failed)}"] if failed else []
    verdict += [f"MISSED: {len(missed)} target(s)"] if missed else []
    print(f"\n{'; '.join(verdict) or 'every step passed or was skipped, no target missed'} ({out})")
    return 1 if failed or missed else 0


if __name__ == "__main__":
    sys.exit(main())
