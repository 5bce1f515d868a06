"""Imports at scale: rows stream to the run (memory does not grow with the file), the
run's status is written after its results, and Ctrl-C leaves it `interrupted`."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commbench.store import results
from commbench.store.importers import import_to_run

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import bench_import  # noqa: E402

from conftest import fixture_path  # noqa: E402


def _import_cmd(src, out):
    return [sys.executable, "-m", "commbench", "import", str(src), "--out", str(out)]


@pytest.mark.multirank
def test_import_memory_does_not_grow_with_the_file(tmp_path):
    """A 12 MB log (about 2 GB of memory when the file and its rows were held whole)."""
    src = tmp_path / "big_all_reduce.txt"
    rows = bench_import.generate(src, 12_000_000, 20_000)
    p = subprocess.Popen(_import_cmd(src, tmp_path / "run"), cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE)
    # The import's own high-water mark (VmHWM: its memory after exec), read until it exits;
    # ru_maxrss would count the copy of this test process that the fork made before exec.
    peak_kib = 0
    while p.poll() is None:
        try:
            for line in open(f"/proc/{p.pid}/status"):
                if line.startswith("VmHWM:"):
                    peak_kib = int(line.split()[1])  # the last reading: after exec it only grows
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    assert p.returncode == 0, p.stderr.read()
    peak_mib = peak_kib / 1024
    assert peak_mib > 0, "no reading of the import's memory"
    assert peak_mib < 250, f"peak RSS {peak_mib:.0f} MiB importing {src.stat().st_size / 1e6:.0f} MB"
    meta = results.load_meta(tmp_path / "run")
    assert meta["status"] == "complete" and meta["points"] == rows
    assert sum(1 for _ in open(tmp_path / "run" / "rows.jsonl")) == rows


def test_status_is_written_after_the_results(tmp_path, monkeypatch):
    seen = []
    write_csv = results.RunDir.write_csv

    def watch(self):
        seen.append(json.loads(self.meta_path.read_text())["status"])
        write_csv(self)
        seen.append(json.loads(self.meta_path.read_text())["status"])

    monkeypatch.setattr(results.RunDir, "write_csv", watch)
    d, meta = import_to_run(fixture_path("nccl_all_reduce_8gpu.txt"), out=tmp_path / "run")
    assert seen == ["running", "running"]  # complete only once results.csv is whole
    assert results.load_meta(d)["status"] == "complete" and (d / "results.csv").is_file()


@pytest.mark.multirank
def test_ctrl_c_leaves_the_import_interrupted(tmp_path):
    src = tmp_path / "big_all_reduce.txt"
    bench_import.generate(src, 40_000_000, 200_000)
    out = tmp_path / "run"
    # SIGINT back to its default in the child: a shell that starts the tests in the background
    # ignores SIGINT, children inherit that, and Python then never raises KeyboardInterrupt.
    p = subprocess.Popen(_import_cmd(src, out), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    rows = out / "rows.jsonl"
    while time.monotonic() < deadline and not (rows.is_file() and rows.stat().st_size > 0):
        time.sleep(0.05)
    assert p.poll() is None, "the import ended before it could be interrupted"
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    meta = results.load_meta(out)
    assert meta["status"] == "interrupted", meta["status"]
    assert meta["reason"].startswith("interrupted during the import, after ")
    n = int(meta["reason"].split("after ")[1].split()[0])
    assert 0 < n == rows.read_bytes().count(b"\n")  # the rows it counted, all in rows.jsonl


@pytest.mark.parametrize("bad", ["# OSU MPI Allreduce Latency Test v7.4\n# Size  Avg Latency(us)\n4 1.5 9\n"])
@pytest.mark.multirank
def test_refused_import_leaves_no_run(tmp_path, bad):
    src = tmp_path / "osu_allreduce.txt"
    src.write_text(bad)
    r = subprocess.run(_import_cmd(src, tmp_path / "run") + ["--world", "2"], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 2 and "expected 2 fields" in r.stderr and r.stderr.count("\n") == 1
    assert not (tmp_path / "run").exists()
