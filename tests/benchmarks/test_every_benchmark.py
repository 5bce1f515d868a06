"""Every registered benchmark on both loopback backends, real ranks, check on."""

import pytest

from commbench.benchmarks import registry
from commbench.core.schema import ROW_FIELDS
from commbench.store.load import load
from conftest import needs_mpi, needs_torch, run_cli, run_meta

STANDARD = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send_recv", "barrier"]
OTHERS = ["moe", "overlap", "pairs"]  # tested in test_moe_bench.py, test_overlap.py, test_pairs_bench.py


def _run(tmp_path, backend, np_, benches, dtypes="float32", sizes="16:4K:16"):
    out = tmp_path / f"{backend}{np_}"
    p = run_cli("run", "-b", ",".join(benches), "--backend", backend, "--np", np_, "--sizes", sizes,
                "--dtypes", dtypes, "--check", "--iters", 5, "--warmup", 1, "--out", out)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out, load(out)


def _assert_all_ok(df, benches, np_):
    assert set(df["benchmark"]) == set(benches)
    bad = df[(df["check"] != "ok") & (df["benchmark"] != "barrier")]
    assert bad.empty, bad[["benchmark", "world", "nbytes", "check"]]
    assert set(df["world"]) == {w for w in (2, 4, 8) if w <= np_} | {np_}
    assert (df["time_us_p50"] > 0).all() and (df["time_us_min"] <= df["time_us_p50"]).all()
    assert (df["time_us_p50"] <= df["time_us_max"]).all()


def test_every_registered_benchmark_is_in_the_standard_list():
    assert set(registry()) == set(STANDARD) | set(OTHERS)


@needs_mpi
@pytest.mark.parametrize("np_", [2, 4])
@pytest.mark.multirank
def test_mpi_every_benchmark(tmp_path, np_):
    out, df = _run(tmp_path, "mpi", np_, STANDARD, dtypes="float32,int32,float16")
    _assert_all_ok(df, STANDARD, np_)
    assert set(df["dtype"]) >= {"float32", "int32", "float16"}
    meta = run_meta(out)
    assert meta["status"] == "complete" and meta["world"] == np_ and len(meta["hosts"]) == np_
    assert meta["versions"]["mpi4py"] and "Open MPI" in meta["versions"]["mpi_library"] or "MPICH" in meta["versions"]["mpi_library"]
    assert set(ROW_FIELDS) <= set(df.columns)


@needs_torch
@pytest.mark.parametrize("np_", [3])
@pytest.mark.multirank
def test_gloo_every_benchmark(tmp_path, np_):
    benches = [b for b in STANDARD if b != "send_recv"]  # odd world: no pairs
    out, df = _run(tmp_path, "gloo", np_, benches, dtypes="float32,bfloat16")
    _assert_all_ok(df, benches, np_)
    assert set(df["dtype"]) >= {"float32", "bfloat16"}


@needs_torch
@pytest.mark.multirank
def test_gloo_pairs_and_all_dtypes(tmp_path):
    out, df = _run(tmp_path, "gloo", 2, STANDARD, dtypes="float32,bfloat16,float16,int32", sizes="64,1K")
    _assert_all_ok(df, STANDARD, 2)
    assert set(df["dtype"]) == {"float32", "bfloat16", "float16", "int32"}


@pytest.mark.parametrize("backend", [pytest.param("mpi", marks=needs_mpi), pytest.param("gloo", marks=needs_torch)])
@pytest.mark.multirank
def test_check_catches_wrong_data(tmp_path, backend):
    out = tmp_path / "bad"
    p = run_cli("run", "-b", "all_reduce_corrupt", "--backend", backend, "--np", 2, "--sizes", "64",
                "--check", "--iters", 3, "--out", out, env={"COMMBENCH_PLUGINS": "corrupt_plugin"})
    assert p.returncode != 0
    assert "failed the data check" in p.stderr
    df = load(out)
    assert list(df["check"]) == ["fail"]
    assert run_meta(out)["status"] == "check_failed"
