"""Real nccl-tests and OSU outputs, as people posted them (tests/fixtures/real-outputs/, each
file's source in SOURCES.tsv): each imports with exact row counts and values, or is refused
in one line that says why; every line the importer skips is said in import_notes."""
from __future__ import annotations

import csv
import math

import pytest

from commbench.core.errors import UsageError
from commbench.store.importers import import_file, import_to_run
from conftest import fixture_path, run_cli

REAL = fixture_path("real-outputs")


def _notes(meta) -> str:
    return "\n".join(meta["import_notes"])


def test_every_file_has_its_source():
    with open(REAL / "SOURCES.tsv", newline="") as f:
        named = {r["file"]: r for r in csv.DictReader(f, delimiter="\t")}
    files = {p.name for p in REAL.iterdir() if p.name != "SOURCES.tsv"}
    assert files == set(named), files ^ set(named)
    assert all(r["source"] and r["what it is"] for r in named.values())


# file, import arguments, rows, world, benchmarks
IMPORTS = [
    ("a3mega_nccl_allreduce_16r.txt", {}, 62, 16, {"all_reduce"}),
    ("aws_srun_label_allreduce_p5.txt", {"world": 16}, 64, 16, {"all_reduce"}),
    ("coreweave_gb200_nvl72_72r_excerpt.txt", {"benchmark": "all_reduce"}, 10, 72, {"all_reduce"}),
    ("superbench_nccl_alltoall.log", {}, 58, 8, {"all_to_all"}),
    ("cscs_osu7.5_bw_DD_validation.txt", {}, 23, 2, {"send_recv"}),
    ("libfabric_cray_osu5.0_latency.txt", {}, 23, 2, {"send_recv"}),
    ("mv2gdr_osu5.9_cuda_allreduce_warn_interleaved.txt", {"world": 2}, 19, 2, {"all_reduce"}),
    ("spack_osu5.6.3_multi_collectives.txt", {"world": 2}, 79, 2, {"reduce", "barrier", "overlap", "reduce_scatter"}),
]


@pytest.mark.parametrize("name,kw,count,world,benches", IMPORTS)
def test_real_output_imports(name, kw, count, world, benches):
    rows, meta = import_file(REAL / name, **kw)
    assert len(rows) == count and meta["points"] == count
    assert {r["benchmark"] for r in rows} == benches
    assert meta["world"] == world
    for r in rows:
        assert r["time_us_p50"] > 0 and math.isnan(r["time_us_p99"])  # no file here gives a p99
        assert "slowest rank" not in r["time_measured"]


# file, import arguments, what the one-line refusal says
REFUSALS = [
    ("aws_srun_label_allreduce_p5.txt", {}, ":1: no '#  Rank N Group G Pid P on HOST device D' lines: pass --world N"),
    ("coreweave_gb200_nvl72_72r_excerpt.txt", {}, ":1: cannot tell the collective"),
    ("coreweave_gb200_nvl72_72r_excerpt.txt", {"benchmark": "all_reduce", "world": 8},
     "the file lists rank 71 ('#  Rank' lines), --world says 8"),
    ("mv2gdr_osu5.9_cuda_allreduce_warn_interleaved.txt", {}, ":6: OSU output does not carry the rank count"),
    ("spack_osu5.6.3_multi_collectives.txt", {}, ":3: OSU output does not carry the rank count"),
]


@pytest.mark.parametrize("name,kw,says", REFUSALS)
@pytest.mark.multirank
def test_real_output_refused_in_one_line(name, kw, says, tmp_path):
    with pytest.raises(UsageError) as e:
        import_file(REAL / name, **kw)
    assert says in str(e.value) and "\n" not in str(e.value)
    args = [f"--{k}={v}" for k, v in kw.items()]
    r = run_cli("import", str(REAL / name), *args, "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()


def test_srun_label_prefix_is_cut():
    rows, meta = import_file(REAL / "aws_srun_label_allreduce_p5.txt", world=16)
    r = next(r for r in rows if r["nbytes"] == 17179869184 and r["placement"] == "out-of-place")
    assert (r["time_us_p50"], r["algbw_gbps"], r["busbw_gbps"]) == (66132.0, 259.78, 487.09)
    assert r["busbw_factor"] == pytest.approx(487.09 / 259.78, rel=1e-3)  # 2(n-1)/n with n = 16
    assert "ends without its footer" in _notes(meta) and "cut after line 34" in _notes(meta)


def test_world_from_the_highest_rank_line():
    rows, meta = import_file(REAL / "coreweave_gb200_nvl72_72r_excerpt.txt", benchmark="all_reduce")
    assert {r["world"] for r in rows} == {72}
    assert rows[0]["busbw_factor"] == pytest.approx(2 * 71 / 72)
    assert rows[0]["busbw_factor"] == pytest.approx(586.06 / 297.16, rel=1e-3)  # the file's own ratio
    assert "'#  Rank' lines for 1 of 72 ranks" in _notes(meta)
    rows, meta = import_file(REAL / "coreweave_gb200_nvl72_72r_excerpt.txt", benchmark="all_reduce", world=144)
    assert {r["world"] for r in rows} == {144} and "from --world" in _notes(meta)
    rows, meta = import_file(REAL / "a3mega_nccl_allreduce_16r.txt")
    assert meta["hosts"] == ["ztan-mig-235z"] * 8 + ["ztan-mig-gq73"] * 8
    assert [n.split(":")[0] for n in meta["import_notes"]] == [f"line {i}" for i in range(3, 8)]


def test_pre_2_10_alltoall_has_an_empty_redop():
    rows, meta = import_file(REAL / "superbench_nccl_alltoall.log")
    r = next(r for r in rows if r["nbytes"] == 8589934592 and r["placement"] == "in-place")
    assert (r["time_us_p50"], r["algbw_gbps"], r["busbw_gbps"]) == (33234.0, 258.47, 226.16)
    assert r["redop"] is None and r["params"] == {} and r["check"] == "skipped"
    assert "5 size-0 line(s) skipped" in _notes(meta)


def test_osu_warnings_inside_the_table_keep_every_row():
    rows, meta = import_file(REAL / "mv2gdr_osu5.9_cuda_allreduce_warn_interleaved.txt", world=2)
    assert [r["nbytes"] for r in rows] == [4 << k for k in range(19)]
    assert rows[-1]["time_us_p50"] == 630.67 and rows[-1]["device"] == "cuda"
    notes = meta["import_notes"]
    assert any(n.startswith("line 11: not understood (inside the OSU table of line 6)") for n in notes)
    assert any(n.startswith("line 12: not understood (inside the OSU table of line 6)") for n in notes)
    assert any(n.startswith("line 1: not understood") and "mpirun_rsh" in n for n in notes)


def test_osu_multi_test_log_with_barrier_and_an_unknown_test():
    rows, meta = import_file(REAL / "spack_osu5.6.3_multi_collectives.txt", world=2)
    by = {}
    for r in rows:
        by.setdefault(r["benchmark"], []).append(r)
    assert {k: len(v) for k, v in by.items()} == {"reduce": 19, "barrier": 1, "overlap": 40, "reduce_scatter": 19}
    assert by["barrier"][0]["time_us_p50"] == 1.57 and by["barrier"][0]["nbytes"] == 0
    assert {r["params"]["collective"] for r in by["overlap"]} == {"all_reduce", "gather"}
    assert "line 105: OSU test 'Accumulate latency' is not one commbench imports" in _notes(meta)
    assert "its 23 data line(s) skipped" in _notes(meta)


def test_osu_point_to_point_as_send_recv():
    rows, meta = import_file(REAL / "cscs_osu7.5_bw_DD_validation.txt")
    r = rows[-1]
    assert r["benchmark"] == "send_recv" and r["world"] == 2 and r["params"] == {"pattern": "unidirectional"}
    assert r["nbytes"] == 4194304 and r["osu_bw_mbps"] == 23989.54 and r["algbw_gbps"] == pytest.approx(23.98954)
    assert r["time_us_p50"] == pytest.approx(4194304 / 23989.54) and r["check"] == "ok" and r["device"] == "cuda"
    assert "size / OSU's bandwidth" in r["time_measured"]
    rows, meta = import_file(REAL / "libfabric_cray_osu5.0_latency.txt")
    assert rows[0]["nbytes"] == 1 and rows[-1]["time_us_p50"] == 497.37 and rows[-1]["device"] == "cpu"
    assert {r["params"]["pattern"] for r in rows} == {"ping-pong"} and "1 size-0 line(s) skipped" in _notes(meta)


def test_osu_bidirectional_bandwidth(tmp_path):
    text = (REAL / "cscs_osu7.5_bw_DD_validation.txt").read_text()
    p = tmp_path / "bibw.txt"
    p.write_text(text.replace("# OSU MPI-CUDA Bandwidth Test v7.5",
                              "# OSU MPI-CUDA Bi-Directional Bandwidth Test v7.5\n"
                              "# Send Buffer on DEVICE (D) and Receive Buffer on DEVICE (D)"))
    rows, _ = import_file(p)
    r = rows[-1]
    assert r["params"] == {"pattern": "bidirectional"} and r["osu_buffers"] == "D D"
    assert r["algbw_gbps"] == pytest.approx(23.98954 / 2)  # S per direction
    assert r["time_us_p50"] == pytest.approx(2 * 4194304 / 23989.54)
    p.write_text(text.replace("Bandwidth Test", "Multiple Bandwidth / Message Rate Test"))
    with pytest.raises(UsageError, match="no OSU test commbench imports: 'Multiple Bandwidth / Message Rate'"):
        import_file(p)


def test_tagged_output_is_not_taken_for_json(tmp_path):
    """mpirun --tag-output (and --timestamp-output) lines import like the untagged file."""
    plain = (REAL / "a3mega_nccl_allreduce_16r.txt").read_text().splitlines()
    p = tmp_path / "tagged_allreduce.txt"
    p.write_text("\n".join(f"[1,0]<stdout>:{l}" for l in plain) + "\n")
    want, _ = import_file(REAL / "a3mega_nccl_allreduce_16r.txt")
    got, _ = import_file(p)
    assert [(r["nbytes"], r["time_us_p50"]) for r in got] == [(r["nbytes"], r["time_us_p50"]) for r in want]
    p.write_text("\n".join(f"Sun Dec 24 09:52:05 2017[1,0]<stdout>:{l}" for l in plain) + "\n")
    assert len(import_file(p)[0]) == 62


def test_nccl_log_lines_inside_the_table(tmp_path):
    """NCCL_DEBUG lines (its real shape) between rows and inside a row that nccl-tests
    printed in two parts: every row imports exactly and the log lines are counted."""
    lines = (REAL / "a3mega_nccl_allreduce_16r.txt").read_text().splitlines()
    at = next(i for i, l in enumerate(lines) if l.strip().startswith("1048576 "))
    row = lines[at]
    half = row.index("207.2") - 1  # the out-of-place half, then the in-place half
    warn = "ztan-mig-235z:6899:7012 [0] misc/ibvwrap.cc:63 NCCL WARN Call to ibv_reg_mr failed"
    info = "ztan-mig-235z:6899:6899 [0] NCCL INFO Channel 00/32 : 0 1 2 3 4 5 6 7"
    p = tmp_path / "allreduce_log.txt"
    p.write_text("\n".join(lines[:at] + [info, row[:half] + warn, row[half:]] + lines[at + 1:]) + "\n")
    rows, meta = import_file(p)
    assert len(rows) == 62
    ip = next(r for r in rows if r["nbytes"] == 1048576 and r["placement"] == "in-place")
    assert (ip["time_us_p50"], ip["busbw_gbps"]) == (207.2, 9.49)
    assert f"2 NCCL log (INFO/WARN) line(s) skipped (lines {at + 1}-{at + 2})" in _notes(meta)
    assert f"line {at + 2}: a size line cut in two by an NCCL log line" in _notes(meta)


def test_osu_noise_before_the_first_row(tmp_path):
    lines = (REAL / "mv2gdr_osu5.9_cuda_allreduce_warn_interleaved.txt").read_text().splitlines()
    head = lines.index("# Size       Avg Latency(us)")
    p = tmp_path / "noise_first.txt"
    p.write_text("\n".join(lines[:head + 1] + ["[a100-01.cluster:mpi_rank_1] warming up"] + lines[head + 1:]) + "\n")
    rows, meta = import_file(p, world=2)
    assert len(rows) == 19 and f"line {head + 2}: not understood" in _notes(meta)


@pytest.mark.multirank
def test_report_footer_says_how_the_source_measured(tmp_path):
    d, _ = import_to_run(REAL / "superbench_nccl_alltoall.log", out=tmp_path / "nccl")
    r = run_cli("report", str(d))
    assert r.returncode == 0, r.stderr
    assert "rank 0's mean over its timed loop" in r.stdout and "slowest rank per iteration" not in r.stdout
    d, _ = import_to_run(REAL / "mv2gdr_osu5.9_cuda_allreduce_warn_interleaved.txt", world=2, out=tmp_path / "osu")
    r = run_cli("report", str(d))
    assert r.returncode == 0, r.stderr
    assert "average over ranks of each rank's mean" in r.stdout and "slowest rank per iteration" not in r.stdout


def test_a_world_the_bandwidths_contradict_is_said():
    """nccl-tests' busbw = algbw x its factor for the world it ran (both to 2 decimals)."""
    for name, kw in (("aws_srun_label_allreduce_p5.txt", {"world": 16}),
                     ("coreweave_gb200_nvl72_72r_excerpt.txt", {"benchmark": "all_reduce"}),
                     ("a3mega_nccl_allreduce_16r.txt", {}), ("superbench_nccl_alltoall.log", {})):
        assert "busbw/algbw" not in _notes(import_file(REAL / name, **kw)[1]), name
    _, meta = import_file(REAL / "aws_srun_label_allreduce_p5.txt", world=8)
    assert "line 17: the file's busbw/algbw = 1.883, but all_reduce at world 8 has factor 1.750" in _notes(meta)
    _, meta = import_file(REAL / "coreweave_gb200_nvl72_72r_excerpt.txt", benchmark="all_reduce", world=144)
    assert "busbw/algbw = 1.972, but all_reduce at world 144 has factor 1.986" in _notes(meta)


def test_osu_7_latency_tail_columns(tmp_path):
    """OMB 7 osu_latency prints P50/P90/P99 tail latencies beside the average."""
    p = tmp_path / "osu_latency.txt"
    p.write_text("# OSU MPI Latency Test v7.4\n# Datatype: MPI_CHAR.\n"
                 "# Size       Avg Latency(us)   P50 Tail Lat(us)   P90 Tail Lat(us)   P99 Tail Lat(us)\n"
                 "1                       1.61               1.58               1.70               2.10\n")
    (r,), _ = import_file(p)
    assert (r["time_us_p50"], r["iter_p50_us"], r["time_us_p90"], r["time_us_p99"]) == (1.61, 1.58, 1.70, 2.10)
    assert r["params"] == {"pattern": "ping-pong"} and math.isnan(r["time_us_min"])
