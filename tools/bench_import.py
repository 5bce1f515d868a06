"""Import at scale: generate a big nccl-tests stdout (many collectives, dtypes, reductions
and sizes, with NCCL_DEBUG=INFO lines between the tables as a real multi-node log has),
import it with `commbench import`, and time `commbench report` of the resulting run. Each
command runs as its own process; its peak RSS is the kernel's (wait4's ru_maxrss).

    .venv/bin/python tools/bench_import.py               # 200 MB, about 336k rows
    .venv/bin/python tools/bench_import.py --mb 20 --rows 34000
    .venv/bin/python tools/bench_import.py --long-line 10,100

Prints the file's size and rows, and each command's wall time and peak RSS, against the
limits (import: 1 GiB; report: 60 s); exit status 1 when a limit is passed.

--long-line MB,MB...: instead, one nccl-tests log per size whose table holds one line of
that many MB without a space (a pattern that backtracks takes hours on 1 MB), each
imported and timed: the times grow as the sizes do when the import is linear."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DTYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16")
ELEM = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "half": 2, "float": 4,
        "double": 8, "bfloat16": 2}
REDOPS = ("sum", "prod", "max", "min", "avg")
# (binary, reduces, has a root, busbw factor for world n)
COLLECTIVES = (("all_reduce_perf", True, False, lambda n: 2 * (n - 1) / n),
               ("reduce_scatter_perf", True, False, lambda n: (n - 1) / n),
               ("reduce_perf", True, True, lambda n: 1.0),
               ("all_gather_perf", False, False, lambda n: (n - 1) / n),
               ("alltoall_perf", False, False, lambda n: (n - 1) / n),
               ("broadcast_perf", False, True, lambda n: 1.0))
WORLD = 16


def _blocks():
    for coll, reduces, rooted, factor in COLLECTIVES:
        for dt in DTYPES:
            for op in (REDOPS if reduces else ("none",)):
                yield coll, dt, op, (0 if rooted else -1), factor


def generate(path: Path, target_nbytes: int, target_rows: int) -> int:
    """Write the file; returns the number of rows it holds (2 per size line)."""
    blocks = list(_blocks())
    sizes_per_block = max(1, target_rows // 2 // len(blocks))
    data_line_nbytes = 119
    noise_nbytes = max(0, target_nbytes - len(blocks) * (sizes_per_block * data_line_nbytes + 2600))
    info_per_block = noise_nbytes // 88 // len(blocks)
    rows = 0
    with open(path, "w") as f:
        for b, (coll, dt, op, root, factor) in enumerate(blocks):
            e = ELEM[dt]
            f.write(f"# nccl-tests version 2.17.1 nccl-headers=22703 nccl-library=22703\n"
                    f"# Collective test starting: {coll}\n"
                    f"# nThread 1 nGpus 1 minBytes {e * 1024} maxBytes {e * 1024 * sizes_per_block} step: "
                    f"{e * 1024}(bytes) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0\n#\n"
                    f"# Using devices\n")
            for r in range(WORLD):
                f.write(f"#  Rank {r:2d} Group  0 Pid {4000 + r:6d} on node-{r // 8:03d} device {r % 8:2d} "
                        f"[0000:{r:02x}:00] NVIDIA H200\n")
            for k in range(info_per_block):
                f.write(f"node-{k % 2:03d}:{4000 + k % WORLD}:{5000 + k % 7} [{k % 8}] NCCL INFO Channel "
                        f"{k % 32:02d}/32 : 0[{k % 8}] -> 1[{(k + 1) % 8}] via P2P/CUMEM/read comm {b}\n")
            f.write("#\n#                                                              out-of-place"
                    "                       in-place          \n"
                    "#       size         count      type   redop    root     time   algbw   busbw #wrong"
                    "     time   algbw   busbw #wrong\n"
                    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
                    "            (us)  (GB/s)  (GB/s)       \n")
            for k in range(1, sizes_per_block + 1):
                nbytes = e * 1024 * k
                t = 20.0 + nbytes / 150e3
                alg = nbytes / t / 1e3
                bus = alg * factor(WORLD)
                half = f"{t:8.2f} {alg:7.2f} {bus:7.2f} {0:6d}"
                f.write(f"{nbytes:12d}  {nbytes // e:12d}  {dt:>8s}  {op:>6s}  {root:6d}  {half}  {half}\n")
                rows += 2
            f.write("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 100.0 \n#\n"
                    f"# Collective test concluded: {coll}\n#\n")
    return rows


def measure(cmd: list[str]) -> tuple[int, float, float, float]:
    """(exit status, wall s, peak RSS MiB, CPU s) of one command, its output thrown away.
    The CPU time (user + system) is what the command cost; on a shared machine the wall
    time also holds the time other processes had the cores."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    err = p.stderr.read().decode(errors="replace").strip()
    if p.returncode:
        print(f"  {' '.join(cmd[2:4])} exit {p.returncode}: {err[-300:]}", flush=True)
    return p.returncode, wall, usage.ru_maxrss / 1024.0, usage.ru_utime + usage.ru_stime


def generate_long_line(path: Path, nbytes: int) -> None:
    """A small nccl-tests table with one line of nbytes bytes inside it (no space, no newline)."""
    half = f"{20.5:8.2f} {0.05:7.2f} {0.09:7.2f} {0:6d}"
    with open(path, "w") as f:
        f.write("# nccl-tests version 2.17.1 nccl-headers=22703 nccl-library=22703\n"
                "# Collective test starting: all_reduce_perf\n"
                "#  Rank  0 Group  0 Pid   4000 on node-000 device  0 [0000:00:00] NVIDIA H200\n"
                "#  Rank  1 Group  0 Pid   4001 on node-000 device  1 [0000:01:00] NVIDIA H200\n"
                "#       size         count      type   redop    root     time   algbw   busbw #wrong"
                "     time   algbw   busbw #wrong\n")
        f.write(f"{1024:12d}  {256:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}  {half}  {half}\n")
        f.write("<script>")
        chunk = "A" * (1 << 20)
        left = nbytes - len("<script>")
        while left > 0:
            f.write(chunk[:min(left, len(chunk))])
            left -= len(chunk)
        f.write("\n")
        f.write(f"{2048:12d}  {512:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}  {half}  {half}\n"
                "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0.09 \n")


def long_lines(sizes_mb: list[float], work_dir, limit_mib: float) -> int:
    """Import one log per size, each with one long line in its table; print each time."""
    ok = True
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp:
        first = None
        for mb in sizes_mb:
            src, out = Path(tmp) / f"long_line_{mb:g}mb_all_reduce.txt", Path(tmp) / f"run_{mb:g}"
            generate_long_line(src, int(mb * 1e6))
            load = os.getloadavg()[0]
            rc, wall, rss, cpu = measure([sys.executable, "-m", "commbench", "import", str(src), "--out", str(out)])
            src.unlink()
            ratio = f", {cpu / first[1]:.1f}x the {first[0]:g} MB one's" if first else ""
            first = first or (mb, cpu)
            ok = ok and rc == 0 and rss <= limit_mib
            print(f"one {mb:g} MB line: import {wall:.1f} s ({cpu:.1f} s CPU{ratio}; load average {load:.1f}), "
                  f"peak RSS {rss:.0f} MiB: {'ok' if rc == 0 and rss <= limit_mib else 'FAILED'}", flush=True)
    return 0 if ok else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=200.0, help="file size, MB (default 200)")
    ap.add_argument("--rows", type=int, default=336_000, help="rows the file holds (default 336000)")
    ap.add_argument("--dir", help="work directory (default: a temporary one, removed after)")
    ap.add_argument("--import-limit-mib", type=float, default=1024.0)
    ap.add_argument("--report-limit-s", type=float, default=60.0)
    ap.add_argument("--long-line", metavar="MB,MB", help="time the import of one long line of each size instead")
    a = ap.parse_args(argv)
    if a.long_line:
        return long_lines([float(x) for x in a.long_line.split(",")], a.dir, a.import_limit_mib)
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        src, out = Path(tmp) / "big_nccl_tests.txt", Path(tmp) / "run"
        t0 = time.perf_counter()
        rows = generate(src, int(a.mb * 1e6), a.rows)
        print(f"generated {src.stat().st_size / 1e6:.0f} MB, {rows} rows in {time.perf_counter() - t0:.1f} s",
              flush=True)
        py = [sys.executable, "-m", "commbench"]
        load = os.getloadavg()[0]
        rc, wall, rss, cpu = measure(py + ["import", str(src), "--out", str(out)])
        ok_import = rc == 0 and rss <= a.import_limit_mib
        print(f"import: {wall:.1f} s ({cpu:.1f} s CPU, load average {load:.1f}), peak RSS {rss:.0f} MiB "
              f"(limit {a.import_limit_mib:.0f} MiB): "
              f"{'ok' if ok_import else 'OVER'}", flush=True)
        load = os.getloadavg()[0]
        rc2, wall2, rss2, cpu2 = measure(py + ["report", str(out)])
        ok_report = rc2 == 0 and wall2 <= a.report_limit_s
        print(f"report: {wall2:.1f} s ({cpu2:.1f} s CPU, load average {load:.1f}), peak RSS {rss2:.0f} MiB "
              f"(limit {a.report_limit_s:.0f} s): "
              f"{'ok' if ok_report else 'OVER'}", flush=True)
    return 0 if ok_import and ok_report else 1


if __name__ == "__main__":
    sys.exit(main())
