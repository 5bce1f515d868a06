"""Shared helpers: run the real CLI in a subprocess, as a user would; find a fixture; read a run
as commbench reads it; make a row at the current schema."""
from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Every file a test reads as input: nccl-tests and OSU outputs, real-outputs/ (outputs as people
# posted them, each one's source in real-outputs/SOURCES.tsv), suite files.
FIXTURES = ROOT / "tests" / "fixtures"


def fixture_path(name: str) -> Path:
    """tests/fixtures/NAME; a name that is not there fails at once, not as an odd import later."""
    p = FIXTURES / name
    if not p.exists():
        raise FileNotFoundError(f"no fixture {name!r} in {FIXTURES}")
    return p


def run_cli(*args, timeout=300, env=None, cwd=None):
    e = dict(os.environ)
    e.pop("COMMBENCH_TTY", None)
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "plugins"), e.get("PYTHONPATH", "")])
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "commbench", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=cwd or ROOT)


needs_mpi = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None, reason="mpi4py not installed")
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")


def _store():
    """The store's reader of runs (RunDir, read_rows_checked): the one place tests import it from."""
    from commbench.store import results

    return results


def run_dir(path):
    """The run at path as a RunDir, the store's own reader and writer."""
    return _store().RunDir(path)


def run_meta(path) -> dict:
    """meta.json of the run at path, read as commbench reads it; it must be there."""
    rd = run_dir(path)
    assert rd.meta_path.is_file(), f"no meta.json in {path}"
    return rd.read_meta()


def run_rows(path) -> list[dict]:
    """The rows of the run at path, read as commbench reads them (migrated to the current
    schema). Every line must be a row: whatever way a run ends, it leaves no torn line."""
    rd = run_dir(path)
    if not rd.rows_path.is_file():
        return []
    rows, bad = _store().read_rows_checked(rd.rows_path)
    assert not bad, f"{rd.rows_path}: lines {bad} are not rows"
    return rows


def kill_pids(pids) -> None:
    """SIGKILL each pid that is still there: what a failed test left running."""
    import signal

    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def tagged_pids(tag: str) -> dict[int, str]:
    """Live processes whose environment holds COMMBENCH_TEST_TAG=tag: pid -> command name."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if f"COMMBENCH_TEST_TAG={tag}".encode() not in (d / "environ").read_bytes().split(b"\0"):
                continue
            stat = (d / "stat").read_text()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2:][:1] not in ("Z", "X"):
            out[int(d.name)] = stat[stat.index("(") + 1:stat.rfind(")")]
    return out


@pytest.fixture
def tag():
    """A tag for this test's processes; whatever still carries it afterwards is killed."""
    import uuid

    t = uuid.uuid4().hex
    yield t
    kill_pids(tagged_pids(t))


def make_row(benchmark="all_reduce", world=2, nbytes=8, p50=1.0, *, spread_pct=0.0, backend="mpi", device="cpu",
             dtype="float32", variant="default", placement="out-of-place", params=None, stage="", iters=100,
             busbw_factor=None, **extra) -> dict:
    """One row as the harness writes it, at the current schema (SCHEMA_VERSION, point_key()):
    p90 sits spread_pct above p50, p99 twice that, the mean half of it, std in proportion;
    min and max spread_pct below and 2 x spread_pct x p50 above; algbw = nbytes / p50 and
    busbw from the benchmark's own factor (1.0 for a name the registry does not know).
    Any field can be given to override what it would be."""
    from commbench.benchmarks import registry
    from commbench.core.schema import SCHEMA_VERSION, point_key

    if busbw_factor is None:
        b = registry().get(benchmark)
        busbw_factor = b.busbw_factor(world) if b is not None and b.collective_rows else 1.0
    s = spread_pct / 100
    algbw = nbytes / (p50 * 1e-6) / 1e9 if nbytes and p50 > 0 else 0.0
    row = {"schema": SCHEMA_VERSION,
           "point_key": point_key(benchmark, world, nbytes, dtype, params or {}, variant, placement),
           "benchmark": benchmark, "backend": backend, "device": device, "world": world, "nbytes": nbytes,
           "dtype": dtype, "variant": variant, "placement": placement, "params": params or {}, "stage": stage,
           "iters": iters, "warmup": 3, "timing": "back_to_back", "clock": "host_clock",
           "time_us_min": p50 * (1 - 2 * s), "time_us_p50": p50, "time_us_mean": p50 * (1 + s / 2),
           "time_us_p90": p50 * (1 + s), "time_us_p99": p50 * (1 + 2 * s), "time_us_max": p50 * (1 + 200 * s),
           "time_us_std": p50 * s, "algbw_gbps": algbw, "busbw_gbps": algbw * busbw_factor,
           "busbw_factor": busbw_factor, "check": "ok"}
    row.update(extra)
    return row


# --- multirank: a test that starts processes says so ------------------------------------------
# What makes a test slow on 2 cores is starting processes: ranks, a launcher, the CLI, another
# Python. A test that does carries the `multirank` marker (@pytest.mark.multirank, or its
# module's pytestmark; a test using a fixture made with @starts_processes gets it from there),
# and `make test-fast` leaves it out. The marker cannot be forgotten: while a test runs (its
# fixtures too), starting Python, commbench or a launcher without it fails the test, naming
# the command. Tools that return at once (git, make -n, mpicc, mount) need no marker.
_LAUNCHERS = ("python", "commbench", "mpirun", "mpiexec", "orterun", "prterun", "torchrun", "srun")
_running: list = []  # the test whose setup, call or teardown runs now


def starts_processes(fixture_func):
    """For a fixture that starts processes: every test that uses it is `multirank`."""
    fixture_func._starts_processes = True
    return fixture_func


def _program_started(argv) -> str | None:
    """The command line where it starts Python, commbench or a launcher (also behind env,
    ip netns exec, unshare, sh -c ...), else None."""
    if isinstance(argv, (str, bytes, os.PathLike)):
        argv = os.fsdecode(argv)
        try:
            words = shlex.split(argv)
        except ValueError:  # a shell line shlex cannot split (an open quote): its words as written
            words = argv.split()
    else:
        words = [os.fsdecode(w) for w in argv or ()]
    for word in words:
        for token in (t.strip("'\"") for t in word.split()):
            if os.path.basename(token).startswith(_LAUNCHERS) or token == sys.executable:
                return " ".join(words)[:200]
    return None


def _refuse_unmarked_process(event: str, args: tuple) -> None:
    if event != "subprocess.Popen" or not _running or _running[-1].get_closest_marker("multirank"):
        return
    started = _program_started(args[1])
    if started:
        pytest.fail(f"{_running[-1].nodeid} starts a process without @pytest.mark.multirank: {started}",
                    pytrace=False)


def pytest_configure(config):
    sys.addaudithook(_refuse_unmarked_process)
    # A pytest-xdist worker runs with COLUMNS=80 where pytest alone has none; the CLI's tables
    # would then wrap at 80 in one and not the other. Every test sees the width of a pipe.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)


def pytest_collection_modifyitems(config, items):
    from slow_cases import KEPT_NODE_IDS, SLOW_NODE_IDS

    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = [d for ds in (info.name2fixturedefs.values() if info else ()) for d in ds]
        if any(getattr(d.func, "_starts_processes", False) for d in defs):
            item.add_marker(pytest.mark.multirank)
        if item.nodeid in SLOW_NODE_IDS:
            item.add_marker(pytest.mark.slow)
    # Checked before -m and -k deselect (they run after this hook), where files were named whole.
    if not any("::" in str(a) for a in config.args):
        _check_slow_cases(items, SLOW_NODE_IDS, KEPT_NODE_IDS)


def _check_slow_cases(items, slow_ids, kept_ids) -> None:
    """tests/slow_cases.py names tests by node id: a renamed test would silently stay in
    `make test` (or its kept form silently leave it). In every file collected, each listed id
    must be there, and each kept form there and not slow."""
    by_file: dict[str, set] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::")[0], set()).add(item.nodeid)
    for nodeid in sorted(slow_ids | kept_ids):
        seen = by_file.get(nodeid.split("::")[0])
        if seen is not None and nodeid not in seen:
            raise pytest.UsageError(f"tests/slow_cases.py names {nodeid}, which is not collected: rename it there")
    for item in items:
        if item.nodeid in kept_ids and item.get_closest_marker("slow"):
            raise pytest.UsageError(f"tests/slow_cases.py keeps {item.nodeid} in `make test`, but it is slow")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _running.append(item)
    try:
        return (yield)
    finally:
        _running.pop()


# A torch gloo world of one rank in this process: the MoE engines and library adapters driven
# without a launch (one fixture for every test file that needs it).
@pytest.fixture
def gloo_world1():
    import torch.distributed as dist

    from commbench.backends.torch_dist import TorchComm

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield TorchComm(None, 0, 1, "gloo", "cpu")
    finally:
        dist.destroy_process_group()
