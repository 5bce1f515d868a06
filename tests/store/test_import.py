"""commbench.store.importers: nccl-tests stdout / -J JSON and OSU stdout into commbench rows."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from commbench.core.errors import UsageError
from commbench.core.schema import ROW_FIELDS, SCHEMA_VERSION
from commbench.store.importers import detect_format, import_file, write_imported_run
from commbench.store.load import load
from commbench.store.results import load_meta
from conftest import FIXTURES, run_cli

FIX = FIXTURES

# file, world argument, format, benchmark, world, rows
CASES = [
    ("nccl_all_reduce_8gpu.txt", None, "nccl-tests", "all_reduce", 8, 18),
    ("nccl_all_reduce_8gpu_I.txt", None, "nccl-tests", "all_reduce", 8, 16),
    ("all_gather_perf_2x8_C_S.log", None, "nccl-tests", "all_gather", 16, 10),
    ("nccl_alltoall_8gpu.txt", None, "nccl-tests", "all_to_all", 8, 14),
    ("nccl_reduce_scatter.json", None, "nccl-tests-json", "reduce_scatter", 8, 7),
    ("osu_allreduce.txt", 16, "osu", "all_reduce", 16, 19),
    ("osu_allreduce_f.txt", 16, "osu", "all_reduce", 16, 12),
    ("osu_alltoall.txt", 16, "osu", "all_to_all", 16, 17),
    ("osu_iallreduce.txt", 16, "osu", "overlap", 16, 10),
]


def _by(rows, nbytes, placement=None):
    """The row of that size: in-place, or the other one (out-of-place, or no placement)."""
    hit = [r for r in rows if r["nbytes"] == nbytes and (r["placement"] == "in-place") == (placement == "in-place")]
    assert len(hit) == 1, (nbytes, placement, len(hit))
    assert hit[0]["variant"] == "default"
    return hit[0]


@pytest.mark.parametrize("name,world,fmt,bench,n,count", CASES)
def test_each_fixture_imports(name, world, fmt, bench, n, count):
    rows, meta = import_file(FIX / name, world=world)
    assert meta["source_format"] == fmt
    assert detect_format(FIX / name, (FIX / name).read_text()) == fmt
    assert len(rows) == count
    for r in rows:
        assert set(ROW_FIELDS) <= set(r), set(ROW_FIELDS) - set(r)
        assert r["schema"] == SCHEMA_VERSION and r["timing"] == "imported"
        assert r["benchmark"] == bench and r["world"] == n
        assert r["source"] and r["spread"] in ("std", "none")
        assert r["check"] in ("ok", "skipped", "fail")
        assert r["time_us_p50"] == r["time_us_mean"] > 0
        # A statistic the file does not give is NaN; the ones it gives are ordered.
        known = [r[k] for k in ("time_us_min", "time_us_p50", "time_us_p90", "time_us_p99", "time_us_max")
                 if r[k] == r[k]]
        assert known == sorted(known), known
        assert r["time_measured"].startswith(("nccl-tests:", "OSU:"))
    assert meta["world"] == n and meta["points"] == count


def test_nccl_all_reduce_stdout():
    rows, meta = import_file(FIX / "nccl_all_reduce_8gpu.txt")
    assert sorted({r["nbytes"] for r in rows}) == [8 << (3 * k) for k in range(9)]  # 8 B .. 128 MiB
    big = _by(rows, 128 << 20)
    assert big["time_us_p50"] == 651.40 and big["algbw_gbps"] == 206.05 and big["busbw_gbps"] == 360.58
    assert big["busbw_factor"] == pytest.approx(1.75)
    assert big["dtype"] == "float32" and big["backend"] == "nccl" and big["device"] == "cuda"
    assert big["params"] == {} and big["stage"] == "" and big["iters"] == 20 and big["warmup"] == 5
    assert big["check"] == "ok" and big["spread"] == "none" and big["time_us_std"] is None
    assert "only the mean" in big["source"] and big["time_us_p99"] != big["time_us_p99"]  # NaN: not in the file
    assert big["time_measured"].startswith("nccl-tests: rank 0's mean")
    ip = _by(rows, 128 << 20, "in-place")
    assert ip["time_us_p50"] == 649.80 and ip["busbw_gbps"] == 361.47
    assert meta["hosts"] == ["dgx-h100-01"] * 8 and meta["nodes"] == [0] * 8
    assert meta["gpus"] == ["NVIDIA H100 80GB HBM3"]
    assert meta["versions"] == {"nccl-tests": "2.19.0", "nccl": "2.28.3"}
    assert meta["tool_settings"]["iters"] == 20
    only_oop, _ = import_file(FIX / "nccl_all_reduce_8gpu.txt", in_place=False)
    assert len(only_oop) == 9 and {r["placement"] for r in only_oop} == {"out-of-place"}
    assert {r["variant"] for r in rows} == {"default"} and len({r["point_key"] for r in rows}) == len(rows)


def test_nccl_per_iteration_columns():
    rows, _ = import_file(FIX / "nccl_all_reduce_8gpu_I.txt")
    r = _by(rows, 128 << 20)
    assert r["time_us_p50"] == 651.2
    assert r["time_us_min"] == pytest.approx(631.66, abs=0.01)  # i_min
    assert r["time_us_max"] == pytest.approx(709.81, abs=0.01)  # i_max
    assert r["time_us_p99"] == pytest.approx(690.27, abs=0.01)  # i_p99
    assert r["time_us_std"] == pytest.approx(0.8 / 100 * 651.2)  # i_cv% x mean
    assert r["spread"] == "std" and "-I" in r["source"] and r["iters"] == 50


def test_nccl_cputime_timestamps_two_hosts():
    rows, meta = import_file(FIX / "all_gather_perf_2x8_C_S.log")
    assert meta["hosts"] == ["gpu-node-a"] * 8 + ["gpu-node-b"] * 8
    assert meta["nodes"] == [0] * 8 + [1] * 8
    r = _by(rows, 512 << 20)
    assert r["clock"] == "cpu_time" and r["dtype"] == "bfloat16"
    assert r["time_us_p50"] == 11020.0 and r["busbw_gbps"] == 45.67
    assert r["timestamp"] == "2026-11-30 10:14:09"
    assert r["busbw_factor"] == pytest.approx(15 / 16)


def test_nccl_alltoall_na_and_log_noise():
    rows, meta = import_file(FIX / "nccl_alltoall_8gpu.txt")
    assert min(r["nbytes"] for r in rows) == 512  # the 0-byte line is skipped, and said so
    assert any("size-0" in n for n in meta["import_notes"])
    assert {r["check"] for r in rows if r["placement"] == "out-of-place"} == {"ok"}
    assert {r["check"] for r in rows if r["placement"] == "in-place"} == {"skipped"}  # #wrong N/A
    assert _by(rows, 128 << 20)["busbw_gbps"] == 164.81
    assert meta["versions"]["nccl"] == "2.28.3"


def test_nccl_json():
    rows, meta = import_file(FIX / "nccl_reduce_scatter.json")
    doc = json.loads((FIX / "nccl_reduce_scatter.json").read_text())
    assert meta["versions"]["nccl"] == "2.28.3" and meta["tool"]["json_version"] == 3
    assert meta["env"] == {"NCCL_DEBUG": "WARN", "NCCL_ALGO": "Ring"}
    assert meta["command"][0].endswith("reduce_scatter_perf")
    assert meta["tool_settings"]["per_iter_timing"] is True  # "true" string -> bool
    assert [r["placement"] for r in rows if r["nbytes"] == 64] == ["out-of-place"]  # in_place null
    r = _by(rows, 16777216 * 8)
    res = doc["results"][3]
    it = sorted(res["out_of_place_per_iter"]["times_us"])
    assert r["time_us_p50"] == res["out_of_place"]["time"]
    assert r["time_us_min"] == pytest.approx(it[0]) and r["time_us_max"] == pytest.approx(it[-1])
    assert it[0] < r["time_us_p90"] < it[-1]
    assert r["spread"] == "std" and r["time_us_std"] > 0 and "per-iteration" in r["source"]
    nan_half = _by(rows, 65536 * 8, "in-place")  # alg_bw "nan": recomputed from S / time
    assert nan_half["algbw_gbps"] == pytest.approx(65536 * 8 / (nan_half["time_us_p50"] * 1e-6) / 1e9)
    assert all(r["check"] == "ok" for r in rows)


def test_osu_plain_and_full():
    rows, meta = import_file(FIX / "osu_allreduce.txt", world=16)
    assert [r["nbytes"] for r in rows] == [4 << k for k in range(19)]
    r = _by(rows, 1 << 20)
    assert r["time_us_p50"] == 611.2 and r["dtype"] == "float32" and r["backend"] == "mpi"
    assert r["device"] == "cpu" and r["check"] == "skipped" and r["iters"] is None
    assert r["algbw_gbps"] == pytest.approx((1 << 20) / 611.2e-6 / 1e9)
    assert meta["versions"] == {"osu": "5.3"} and meta["hosts"] == []
    rows, meta = import_file(FIX / "osu_allreduce_f.txt", world=16)
    r = _by(rows, 4)
    assert r["iters"] == 1000 and r["osu_min_us"] == 3.26 and r["osu_max_us"] == 3.79
    assert r["time_us_min"] != r["time_us_min"]  # NaN: OSU's min is over ranks, not iterations
    assert meta["versions"] == {"osu": "7.4"}


def test_osu_alltoall_sizes_are_per_peer():
    rows, meta = import_file(FIX / "osu_alltoall.txt", world=16)
    r = _by(rows, 65536 * 16)
    assert r["tool_nbytes"] == 65536 and r["dtype"] == "uint8"
    assert r["time_us_p50"] == 2702.4 and r["iter_p50_us"] == pytest.approx(2702.4 * 0.97, abs=0.01)
    assert r["time_us_p99"] == pytest.approx(2702.4 * 1.31, abs=0.01)
    assert r["time_us_max"] != r["time_us_max"]  # NaN: not in the file
    assert any("per peer" in n for n in meta["import_notes"])


def test_osu_nonblocking_overlap():
    rows, _ = import_file(FIX / "osu_iallreduce.txt", world=8)
    r = _by(rows, 1 << 20)
    # The fields of commbench's own overlap benchmark.
    assert r["benchmark"] == "overlap" and r["mode"] == "single"
    assert r["params"] == {"mode": "single", "collective": "all_reduce"}
    assert r["time_us_p50"] == 2250.4 == r["t_overall_us"]
    assert r["t_comm_us"] == 1311.9 and r["t_compute_us"] == 1320.6
    assert r["overlap_osu_pct"] == pytest.approx(max(0, 100 - (2250.4 - 1320.6) / 1311.9 * 100), abs=0.01)
    assert r["overlap_imb_pct"] == pytest.approx(100 * (1311.9 + 1320.6 - 2250.4) / 1320.6)
    assert r["exposed_us"] == pytest.approx(2250.4 - 1320.6) and r["compute_slowdown"] is None
    assert r["busbw_factor"] == pytest.approx(2 * 7 / 8)
    assert r["algbw_gbps"] == pytest.approx((1 << 20) / 1311.9e-6 / 1e9)  # the pure collective's
    from commbench.benchmarks.overlap import overlap_imb_pct, overlap_osu_pct

    assert r["overlap_imb_pct"] == pytest.approx(overlap_imb_pct(1311.9, 1320.6, 2250.4))
    assert r["overlap_osu_pct"] == pytest.approx(overlap_osu_pct(1311.9, 1320.6, 2250.4), abs=0.01)


@pytest.mark.parametrize("name,world", [(c[0], c[1]) for c in CASES])
def test_busbw_matches_factor_within_rounding(name, world):
    rows, _ = import_file(FIX / name, world=world)
    for r in rows:
        # The tools print 2 decimals: algbw x F agrees with busbw to the rounding of both.
        assert r["algbw_gbps"] * r["busbw_factor"] == pytest.approx(r["busbw_gbps"], abs=0.01 + 0.006, rel=2e-3)
        if r["benchmark"] != "overlap" and r["algbw_gbps"] >= 1:
            assert r["nbytes"] / (r["time_us_p50"] * 1e3) == pytest.approx(r["algbw_gbps"], rel=5e-3)


@pytest.mark.parametrize("name,world", [(c[0], c[1]) for c in CASES])
def test_round_trip_through_a_result_directory(tmp_path, name, world):
    rows, meta = import_file(FIX / name, world=world)
    out = write_imported_run(rows, meta, tmp_path / "imp")
    m = load_meta(out)
    assert m["status"] == "complete" and m["imported_from"] == str((FIX / name).resolve())
    assert m["source_format"] == meta["source_format"] and m["points"] == len(rows)
    assert (out / "results.csv").is_file()
    df = load(out)
    assert set(df["run"]) == {"imp"}
    back = df.drop(columns="run")
    want = pd.DataFrame(rows)
    pd.testing.assert_frame_equal(back[want.columns], want, check_dtype=False)
    with pytest.raises(UsageError, match="already holds a run"):
        write_imported_run(rows, meta, out)


@pytest.mark.multirank
def test_imported_run_reports_like_a_run(tmp_path):
    rows, meta = import_file(FIX / "nccl_all_reduce_8gpu.txt")
    out = write_imported_run(rows, meta, tmp_path / "imp")
    p = run_cli("report", out)
    assert p.returncode == 0, p.stderr
    assert "all_reduce" in p.stdout and "360.5" in p.stdout


# ------------------------------------------------------------------ bad input

def _one_line(e: UsageError) -> str:
    msg = str(e)
    assert "\n" not in msg
    return msg


def test_other_format_forced(tmp_path):
    with pytest.raises(UsageError) as e:
        import_file(FIX / "osu_allreduce.txt", fmt="nccl-tests")
    assert _one_line(e.value).startswith(f"{FIX / 'osu_allreduce.txt'}:1:") and "nccl-tests" in str(e.value)
    with pytest.raises(UsageError) as e:
        import_file(FIX / "nccl_all_reduce_8gpu.txt", fmt="osu", world=8)
    assert "osu" in _one_line(e.value).lower() and ":1:" in str(e.value)
    with pytest.raises(UsageError) as e:
        import_file(FIX / "nccl_all_reduce_8gpu.txt", fmt="nccl-tests-json")
    assert "JSON" in _one_line(e.value) and ":1:" in str(e.value)


def test_unknown_content(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("hello\nthis is not a benchmark\n")
    with pytest.raises(UsageError) as e:
        import_file(p)
    assert _one_line(e.value).startswith(f"{p}:1:")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"schema": 2, "benchmark": "all_reduce"}\n')
    with pytest.raises(UsageError, match="already commbench rows"):
        import_file(rows)


def test_truncated_nccl_stdout(tmp_path):
    lines = (FIX / "nccl_all_reduce_8gpu.txt").read_text().splitlines()
    cut = next(i for i, l in enumerate(lines) if l.strip().startswith("16777216"))
    # Cut mid-line: the last data line is short.
    p = tmp_path / "cut.txt"
    p.write_text("\n".join(lines[:cut] + [lines[cut][:60]]) + "\n")
    with pytest.raises(UsageError) as e:
        import_file(p)
    assert _one_line(e.value).startswith(f"{p}:{cut + 1}:") and "malformed" in str(e.value)
    # Cut between lines: no footer. Every row read is exact, so they import, and the note
    # says where the output may have been cut.
    p.write_text("\n".join(lines[:cut]) + "\n")
    rows, meta = import_file(p)
    assert len(rows) == 2 * sum(1 for l in lines[:cut] if l.strip()[:1].isdigit())
    assert any(f"cut after line {cut}" in n for n in meta["import_notes"]), meta["import_notes"]


def test_garbage_lines(tmp_path):
    lines = (FIX / "nccl_all_reduce_8gpu.txt").read_text().splitlines()
    at = next(i for i, l in enumerate(lines) if l.strip().startswith("4096"))
    p = tmp_path / "garbage.txt"
    p.write_text("\n".join(lines[:at] + ["Segmentation fault (core dumped)"] + lines[at:]) + "\n")
    rows, meta = import_file(p)  # a line that is not a row is said, the table goes on
    assert len(rows) == 18
    assert any(n.startswith(f"line {at + 1}: not understood") and "Segmentation" in n for n in meta["import_notes"])
    bad = lines[at].replace("18.87", "18.8x")
    p.write_text("\n".join(lines[:at] + [bad] + lines[at + 1:]) + "\n")
    with pytest.raises(UsageError) as e:
        import_file(p)
    assert _one_line(e.value).startswith(f"{p}:{at + 1}:") and "'18.8x'" in str(e.value)

    osu = (FIX / "osu_allreduce.txt").read_text().splitlines()
    q = tmp_path / "osu.txt"
    q.write_text("\n".join(osu[:5] + ["garbage here"] + osu[5:]) + "\n")
    rows, meta = import_file(q, world=4)
    assert len(rows) == 19 and any(n.startswith("line 6: not understood") for n in meta["import_notes"])
    q.write_text("\n".join(osu[:5] + ["64  3.9  17"] + osu[6:]) + "\n")
    with pytest.raises(UsageError) as e:
        import_file(q, world=4)
    assert _one_line(e.value).startswith(f"{q}:6:") and "expected 2 fields" in str(e.value)


def test_osu_noise_after_the_table_is_fine(tmp_path):
    text = (FIX / "osu_allreduce.txt").read_text() + "\n[node01] job finished\n" + \
        (FIX / "osu_alltoall.txt").read_text()
    p = tmp_path / "two.txt"
    p.write_text(text)
    rows, meta = import_file(p, world=4)
    assert {r["benchmark"] for r in rows} == {"all_reduce", "all_to_all"} and len(rows) == 19 + 17


def test_truncated_json(tmp_path):
    text = (FIX / "nccl_reduce_scatter.json").read_text()
    p = tmp_path / "cut.json"
    p.write_text(text[: len(text) // 2])
    with pytest.raises(UsageError) as e:
        import_file(p)
    msg = _one_line(e.value)
    assert msg.startswith(f"{p}:") and "JSON" in msg
    line = int(msg[len(str(p)) + 1:].split(":")[0])
    assert line > 1
    doc = json.loads(text)
    doc["results"][2]["size"] = "lots"
    p.write_text(json.dumps(doc, indent=1))
    with pytest.raises(UsageError) as e:
        import_file(p)
    want = next(i for i, l in enumerate(p.read_text().splitlines(), 1) if '"lots"' in l)
    msg = _one_line(e.value)
    line = int(msg[len(str(p)) + 1:].split(":")[0])
    assert line < want and "results[2]" in msg


def test_osu_needs_world():
    with pytest.raises(UsageError) as e:
        import_file(FIX / "osu_allreduce.txt")
    msg = _one_line(e.value)
    assert msg.startswith(f"{FIX / 'osu_allreduce.txt'}:1:")
    assert "OSU output does not carry the rank count: pass --world N" in msg


def test_world_must_match_the_rank_lines():
    with pytest.raises(UsageError, match="lists rank 7"):
        import_file(FIX / "nccl_all_reduce_8gpu.txt", world=4)
    rows, _ = import_file(FIX / "nccl_all_reduce_8gpu.txt", world=8)
    assert rows[0]["world"] == 8
    # The rank lines may have been cut by whoever kept the output: --world overrides them.
    rows, meta = import_file(FIX / "nccl_all_reduce_8gpu.txt", world=16)
    assert {r["world"] for r in rows} == {16} and rows[0]["busbw_factor"] == pytest.approx(2 * 15 / 16)
    assert any("for 8 of 16 ranks" in n and "--world" in n for n in meta["import_notes"])


def test_collective_from_the_file_name(tmp_path):
    text = "\n".join(l for l in (FIX / "nccl_all_reduce_8gpu.txt").read_text().splitlines()
                     if "Collective test" not in l)
    p = tmp_path / "run3_allreduce_perf.log"
    p.write_text(text)
    rows, _ = import_file(p)
    assert rows[0]["benchmark"] == "all_reduce"
    q = tmp_path / "run3.log"
    q.write_text(text)
    with pytest.raises(UsageError, match="cannot tell the collective"):
        import_file(q)
    rows, _ = import_file(q, benchmark="all_reduce_perf")
    assert rows[0]["benchmark"] == "all_reduce"


def test_missing_file():
    with pytest.raises(UsageError, match="no such file"):
        import_file(FIX / "nope.txt")


def test_import_to_run_merges_files(tmp_path):
    from commbench.store.importers import import_to_run

    d, meta = import_to_run([FIX / "nccl_all_reduce_8gpu.txt", FIX / "nccl_alltoall_8gpu.txt"],
                                  out=tmp_path / "both")
    m = load_meta(d)
    assert len(m["imported_from"]) == 2 and m["status"] == "complete" and m["points"] == 18 + 14
    assert set(load(d)["benchmark"]) == {"all_reduce", "all_to_all"}
    with pytest.raises(UsageError, match="same point twice"):
        import_to_run([FIX / "nccl_all_reduce_8gpu.txt"] * 2, out=tmp_path / "dup")
    assert not (tmp_path / "dup").exists()  # a refused import leaves nothing behind
    d, _ = import_to_run(FIX / "osu_allreduce.txt", world=4, root=tmp_path / "results")
    assert d.parent == tmp_path / "results" and "import-osu_allreduce" in d.name


@pytest.mark.parametrize("line,words", [
    ("8   -3.51", "is not a positive finite time"),
    ("8   nan", "is not a positive finite time"),
    ("8   inf", "is not a positive finite time"),
    ("8   0", "is not a positive finite time"),
    ("100000000000000000000000000000   3.5", "is not a byte count"),
    ("-8   3.5", "is not a byte count"),
])
def test_osu_lines_no_run_could_print_are_refused_with_file_and_line(tmp_path, line, words):
    f = tmp_path / "osu.txt"
    f.write_text("# OSU MPI Allreduce Latency Test v5.3\n# Size         Avg Latency(us)\n4   3.51\n" + line + "\n")
    with pytest.raises(UsageError, match=rf"osu.txt:4: .*{words}"):
        import_file(f, world=2)


def test_nccl_tests_results_without_a_time_are_said_not_dropped(tmp_path):
    text = (FIX / "nccl_all_reduce_8gpu.txt").read_text().splitlines()
    # the 8 B line: both halves' times made NaN
    i = next(k for k, ln in enumerate(text) if ln.split()[:1] == ["8"])
    parts = text[i].split()
    text[i] = " ".join(parts[:5] + ["nan"] + parts[6:9] + ["nan"] + parts[10:])
    f = tmp_path / "all_reduce_perf.txt"
    f.write_text("\n".join(text) + "\n")
    rows, meta = import_file(f)
    assert 8 not in {r["nbytes"] for r in rows}
    assert any("2 result(s) without a valid time" in n for n in meta["import_notes"]), meta["import_notes"]
