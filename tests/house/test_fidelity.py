"""The C reference loop (tools/c_loop.c) and the paired fidelity run (tools/bench_fidelity.py),
at 2 ranks on tiny sweeps: they build, run both timing methods and print what they should."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from commbench.core.errors import UsageError
from commbench.core.whoami import find_mpirun
from commbench.run.launcher import mpirun_command
from conftest import ROOT, needs_mpi, starts_processes

# Every test here starts processes (conftest: the multirank guard).
pytestmark = pytest.mark.multirank

SRC = ROOT / "tools" / "c_loop.c"


def _mpicc() -> str | None:
    here = Path(sys.executable).parent / "mpicc"
    return str(here) if here.exists() else shutil.which("mpicc")


def _mpirun(*argv) -> list[str]:
    """mpirun -np 2 with the flags a root user needs (launch.mpirun_command's), then argv."""
    try:
        find_mpirun()
    except UsageError as e:
        pytest.skip(str(e))
    cmd = mpirun_command(2, [])
    return cmd[:cmd.index(sys.executable)] + [str(a) for a in argv]


@pytest.fixture(scope="module")
@starts_processes
def built(tmp_path_factory):
    """build/c_loop and build/libc_loop.so as `make c-loop` builds them, in a tmp dir."""
    mpicc = _mpicc()
    if not mpicc:
        pytest.skip("no mpicc beside python or on PATH")
    out = tmp_path_factory.mktemp("c_loop")
    probe = out / "probe.c"
    probe.write_text("#include <mpi.h>\nint main(void){return 0;}\n")
    try:
        p = subprocess.run([mpicc, "-o", str(out / "probe"), str(probe)], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"{mpicc} does not run: {e}")
    if p.returncode != 0:
        pytest.skip(f"{mpicc} cannot compile an MPI program (no working C compiler?): {p.stderr.strip()[-300:]}")
    for cmd in ([mpicc, "-O2", "-Wall", "-Werror", "-o", str(out / "c_loop"), str(SRC)],
                [mpicc, "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-DCB_NO_MAIN", "-o", str(out / "libc_loop.so"),
                 str(SRC)]):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
    return out


def _parse(stdout: str) -> list[tuple]:
    rows = []
    for line in stdout.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        op, method, nbytes, iters, mean_us = line.split()
        rows.append((op, method, int(nbytes), int(iters), float(mean_us)))
    return rows


def test_c_loop_both_methods_fixed_iters(built):
    p = subprocess.run(_mpirun(built / "c_loop", "-o", "both", "-m", "both", "-b", "8", "-e", "1K", "-f", "16",
                               "-i", "20", "-w", "2"), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "# op method nbytes iters mean_us" in p.stdout
    rows = _parse(p.stdout)
    want = {(o, m, nb) for o in ("all_reduce", "all_to_all") for m in ("back_to_back", "barrier") for nb in (8, 128)}
    assert {r[:3] for r in rows} == want and len(rows) == len(want)
    assert all(r[3] == 20 and r[4] > 0 for r in rows), rows


def test_c_loop_calibrates_to_min_time(built):
    # A small message needs more iterations for the same time. The calibration reads one
    # probe, which a busy host can stall (5 iterations for 8 B against 98 for 64 KiB once,
    # with other tests on both cores): up to three launches, the relation in one of them. A
    # loop that does not calibrate (a fixed count) fails all three.
    seen = []
    for _ in range(3):
        p = subprocess.run(_mpirun(built / "c_loop", "-o", "all_reduce", "-m", "barrier", "-b", "8", "-e", "64K",
                                   "-f", "8192", "-t", "2", "-n", "5"), capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr[-2000:]
        rows = _parse(p.stdout)
        assert [r[2] for r in rows] == [8, 65536]
        for _, _, _, iters, mean_us in rows:
            assert iters >= 5 and mean_us > 0
        seen.append((rows[0][3], rows[1][3]))
        if rows[0][3] > rows[1][3]:
            break
    assert seen[-1][0] > seen[-1][1], seen


def test_c_loop_rejects_bad_flags(built):
    p = subprocess.run(_mpirun(built / "c_loop", "-o", "nope"), capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "usage" in p.stderr


@needs_mpi
def test_bench_fidelity_end_to_end(built, tmp_path):
    """A tiny sweep through the real driver; the library path is missing, so the driver
    also builds it; commbench's compiled timing loop is built into a fresh cache."""
    lib = tmp_path / "sub" / "libc_loop.so"
    env = dict(os.environ, COMMBENCH_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(ROOT))
    p = subprocess.run(_mpirun(sys.executable, ROOT / "tools" / "bench_fidelity.py", "--sizes", "8,64K",
                               "--rounds", "1", "--min-time-ms", "2", "--lib", lib),
                       capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert lib.is_file()
    out = p.stdout
    assert "p50/C" in out and "mean/C" in out and "rows meet the target" in out
    assert "# commbench timing loop: compiled" in out
    rows = [line.split() for line in out.splitlines() if line.startswith(("all_reduce ", "all_to_all "))]
    assert {(r[0], r[1], r[2]) for r in rows} == {(o, m, s) for o in ("all_reduce", "all_to_all")
                                                  for m in ("back_to_back", "barrier") for s in ("8", "64K")}
    for r in rows:
        c, py, p50, mean, rp, rm = map(float, r[3:9])
        assert min(c, py, p50, mean) > 0
        assert rp == pytest.approx(p50 / c, rel=0.01, abs=0.002) and rm == pytest.approx(mean / c, rel=0.01, abs=0.002)


_LOOP_SCRIPT = r"""
import sys
from mpi4py import MPI
from commbench.backends import mpi_timeloop
from commbench.backends.mpi import MpiComm
from commbench.benchmarks import Point, get

cb = MpiComm(MPI.COMM_WORLD, "cpu")
for name in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send_recv"):
    bench = get(name)
    point = Point(name, cb.size, "float32", 4096)
    bufs = bench.setup(cb, point)
    bench.fill(cb, bufs)
    op = bench.op(cb, bufs)
    for barrier_each in (False, True):
        t = cb.time_ops(op, 7, barrier_each=barrier_each)
        assert t.shape == (7,) and (t > 0).all(), (name, t)
    ok = bench.check(cb, bufs)  # the result of the last compiled (or Python) call
    if cb.rank == 0:
        print(name, hasattr(op, "compiled_loop"), ok)
if cb.rank == 0:
    print("status", mpi_timeloop.status())
"""


@needs_mpi
@pytest.mark.parametrize("enabled", ["1", "0"])
def test_compiled_timing_loop_results_and_fallback(built, tmp_path, enabled):
    """commbench's compiled loop (backends/mpi_timeloop.py) leaves every collective's result
    correct; COMMBENCH_COMPILED_LOOP=0 keeps the Python loop."""
    script = tmp_path / "loop.py"
    script.write_text(_LOOP_SCRIPT)
    env = dict(os.environ, COMMBENCH_CACHE=str(tmp_path / "cache"), COMMBENCH_COMPILED_LOOP=enabled)
    p = subprocess.run(_mpirun(sys.executable, script), capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in p.stdout.strip().splitlines())
    want = "True True" if enabled == "1" else "False True"
    for name in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send_recv"):
        assert lines[name] == want, p.stdout
    assert lines["status"].startswith("compiled: " if enabled == "1" else "python loop: "), p.stdout


_PLANT_SCRIPT = r"""
from mpi4py import MPI
from commbench.backends.mpi import MpiComm
from commbench.benchmarks import Point, get
from commbench.run import plant

cb = MpiComm(MPI.COMM_WORLD, "cpu")
bench = get("all_reduce")
point = Point("all_reduce", cb.size, "float32", 4096)
bufs = bench.setup(cb, point)
bench.fill(cb, bufs)
op = bench.op(cb, bufs)
slowed = plant.wrap(op, 100.0, cb)
spin = slowed.compiled_loop.spin_s
t = cb.time_ops(slowed, 20)
ok = bench.check(cb, bufs)
if cb.rank == 0:
    print("same", plant.wrap(op, 0.0, cb) is op)
    print("compiled", hasattr(slowed, "compiled_loop"))
    print("spin_ok", spin > 0 and bool((t >= spin).all()))
    print("check", ok)
"""


@needs_mpi
def test_a_planted_slowdown_spins_inside_the_compiled_loop(built, tmp_path):
    """The regression gate's hook (run/plant.py) keeps the compiled loop: the spin (100 % of the
    op's median here) runs inside every timed call, the collective's result stays right, and
    at 0 % the op is returned as it is, so the other side times the same loop."""
    script = tmp_path / "plant.py"
    script.write_text(_PLANT_SCRIPT)
    env = dict(os.environ, COMMBENCH_CACHE=str(tmp_path / "cache"))
    p = subprocess.run(_mpirun(sys.executable, script), capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = dict(line.split(" ", 1) for line in p.stdout.strip().splitlines())
    assert lines == {"same": "True", "compiled": "True", "spin_ok": "True", "check": "True"}, p.stdout
