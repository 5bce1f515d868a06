"""The GPU library dispatchers (`deepep`, `deepep-ll`, `pplx`): why they are skipped here,
their plumbing against the fakes of deep_ep and pplx_kernels in
tests/fixtures/fake_gpu_libs (which follow the libraries' public signatures, checked here
against the upstream ones), and their checks failing on a wrong exchange. None of this
runs the real libraries: the adapters are unverified on a GPU."""
import inspect
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from commbench.backends.moe import deepep_adapter, gpu_lib, pplx_adapter
from commbench.store.load import load
from conftest import run_cli

FAKES = Path(__file__).resolve().parents[1] / "fixtures" / "fake_gpu_libs"
SMALL = ["--param", "moe.tokens=16", "--param", "moe.hidden=256", "--param", "moe.experts=8", "--param", "moe.topk=2"]
REQ = inspect.Parameter.empty

# The upstream signatures the fakes and the adapters follow (parameter, default; REQ: none).
# deepseek-ai/DeepEP deep_ep/buffer.py at 92fe2deaec24c92ebd9de276daa6ca9ed602ed4
DEEPEP = {
    "__init__": ("buffer.py:32-43", [("self", REQ), ("group", REQ), ("num_nvl_bytes", 0), ("num_rdma_bytes", 0),
                                     ("low_latency_mode", False), ("num_qps_per_rank", 24),
                                     ("allow_nvlink_for_low_latency_mode", True), ("allow_mnnvl", False),
                                     ("use_fabric", False), ("explicitly_destroy", False), ("enable_shrink", False),
                                     ("comm", None)]),
    "destroy": ("buffer.py:138", [("self", REQ)]),
    "get_low_latency_rdma_size_hint": ("buffer.py:176", [("num_max_dispatch_tokens_per_rank", REQ), ("hidden", REQ),
                                                         ("num_ranks", REQ), ("num_experts", REQ)]),
    "get_dispatch_layout": ("buffer.py:293-295", [("self", REQ), ("topk_idx", REQ), ("num_experts", REQ),
                                                  ("previous_event", None), ("async_finish", False),
                                                  ("allocate_on_comm_stream", False)]),
    "dispatch": ("buffer.py:322-330", [("self", REQ), ("x", REQ), ("handle", None), ("num_tokens_per_rank", None),
                                       ("num_tokens_per_rdma_rank", None), ("is_token_in_rank", None),
                                       ("num_tokens_per_expert", None), ("topk_idx", None), ("topk_weights", None),
                                       ("expert_alignment", 1), ("num_worst_tokens", 0), ("config", None),
                                       ("previous_event", None), ("async_finish", False),
                                       ("allocate_on_comm_stream", False)]),
    "combine": ("buffer.py:405-410", [("self", REQ), ("x", REQ), ("handle", REQ), ("topk_weights", None),
                                      ("bias", None), ("config", None), ("previous_event", None),
                                      ("async_finish", False), ("allocate_on_comm_stream", False)]),
    "low_latency_dispatch": ("buffer.py:548-553", [("self", REQ), ("x", REQ), ("topk_idx", REQ),
                                                   ("num_max_dispatch_tokens_per_rank", REQ), ("num_experts", REQ),
                                                   ("cumulative_local_expert_recv_stats", None),
                                                   ("dispatch_wait_recv_cost_stats", None), ("use_fp8", True),
                                                   ("round_scale", False), ("use_ue8m0", False),
                                                   ("async_finish", False), ("return_recv_hook", False)]),
    "low_latency_combine": ("buffer.py:617-620", [("self", REQ), ("x", REQ), ("topk_idx", REQ),
                                                  ("topk_weights", REQ), ("handle", REQ), ("use_logfmt", False),
                                                  ("zero_copy", False), ("async_finish", False),
                                                  ("return_recv_hook", False), ("out", None),
                                                  ("combine_wait_recv_cost_stats", None)]),
}
# ppl-ai/pplx-kernels src/pplx_kernels/all_to_all.py and nvshmem.py at 12cecfda252e4e646417ac263d96e994d476ee5d
_A2A_CREATE = [("max_num_tokens", REQ), ("num_experts", REQ), ("experts_per_token", REQ), ("rank", REQ),
               ("world_size", REQ), ("dp_size", REQ), ("hidden_dim", REQ), ("hidden_dim_bytes", REQ),
               ("hidden_dim_scale_bytes", REQ)]
PPLX = {
    "dispatch": ("all_to_all.py:27-38", [("self", REQ), ("out_expert_num_tokens", REQ), ("out_expert_x", REQ),
                                         ("out_expert_x_scale", REQ), ("dp_x", REQ), ("dp_x_scale", REQ),
                                         ("indices", REQ), ("bound_m", REQ), ("do_send", True), ("do_recv", True)]),
    "combine": ("all_to_all.py:61-70", [("self", REQ), ("out_tokens", REQ), ("indices", REQ), ("weights", REQ),
                                        ("expert_y", REQ), ("bound_m", REQ), ("do_send", True), ("do_recv", True)]),
    "destroy": ("all_to_all.py:83", [("self", REQ)]),
    "intranode": ("all_to_all.py:88-101", _A2A_CREATE + [("group_name", "default")]),  # a classmethod: no cls
    "internode": ("all_to_all.py:128-140", list(_A2A_CREATE)),
}
NVSHMEM = {"nvshmem_get_unique_id": ("nvshmem.py:12", []), "nvshmem_alloc_empty_unique_id": ("nvshmem.py:20", []),
           "nvshmem_init": ("nvshmem.py:24", [("uid", REQ), ("rank", REQ), ("world_size", REQ)])}


def upstream(params) -> inspect.Signature:
    return inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d)
                              for n, d in params])


def shape_of(fn) -> list:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.fixture
def fakes(monkeypatch):
    monkeypatch.syspath_prepend(str(FAKES))
    for name in ("deep_ep", "pplx_kernels", "fake_exchange"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    import deep_ep
    import pplx_kernels

    assert deep_ep.__version__ == pplx_kernels.__version__ == "fake"
    return deep_ep, pplx_kernels


# --- why they are skipped ----------------------------------------------------------------

@pytest.mark.parametrize("adapter,module", [(deepep_adapter, "deep_ep"), (pplx_adapter, "pplx_kernels")])
def test_why_not_says_cuda_first_then_the_library(monkeypatch, adapter, module):
    monkeypatch.delenv(gpu_lib.FAKE_ENV, raising=False)
    monkeypatch.setitem(sys.modules, module, None)  # `import module` raises ImportError
    for backend, device in (("gloo", "cpu"), ("mpi", "cpu"), ("nccl", "cpu"), ("jax", "cuda")):
        assert adapter.why_not(backend, device, 1, {}) == "needs CUDA (device cuda, backend nccl)"
    why = adapter.why_not("nccl", "cuda", 1, {})
    assert why.startswith(f"the {module} library does not import: ModuleNotFoundError") and "\n" not in why
    monkeypatch.setenv(gpu_lib.FAKE_ENV, "1")  # the tests' switch: gloo on CPU is let through to the import
    assert adapter.why_not("gloo", "cpu", 1, {}).startswith(f"the {module} library does not import")
    assert adapter.why_not("mpi", "cpu", 1, {}) == "needs CUDA (device cuda, backend nccl)"


def test_why_not_is_none_with_the_library_and_the_switch(monkeypatch, fakes):
    monkeypatch.setenv(gpu_lib.FAKE_ENV, "1")
    assert deepep_adapter.why_not("gloo", "cpu", 1, {}) is None and pplx_adapter.why_not("gloo", "cpu", 2, {}) is None
    monkeypatch.setenv(gpu_lib.FAKE_ENV, "0")
    assert deepep_adapter.why_not("gloo", "cpu", 1, {}) == "needs CUDA (device cuda, backend nccl)"


def test_the_three_are_registered_with_their_copies():
    from commbench.benchmarks.moe.dispatchers import DISPATCHERS

    assert DISPATCHERS["deepep"].fixed["copies"] == "rank" and DISPATCHERS["deepep"].serves == ("prefill",)
    assert DISPATCHERS["deepep-ll"].fixed == {"copies": "expert", "mode": "low_latency", "path": "flat"}
    assert DISPATCHERS["pplx"].fixed["copies"] == "expert"
    assert DISPATCHERS["deepep"].why_not is deepep_adapter.why_not
    assert DISPATCHERS["pplx"].why_not is pplx_adapter.why_not


# --- the fakes follow the upstream signatures, and the adapters' calls fit them ------------

def test_the_fakes_have_the_upstream_signatures(fakes):
    deep_ep, pplx_kernels = fakes
    for name, (where, params) in DEEPEP.items():
        assert shape_of(getattr(deep_ep.Buffer, name)) == params, f"deep_ep {where} {name}"
    for name, (where, params) in PPLX.items():
        assert shape_of(getattr(pplx_kernels.AllToAll, name)) == params, f"pplx_kernels {where} {name}"
    for name, (where, params) in NVSHMEM.items():
        assert shape_of(getattr(pplx_kernels, name)) == params, f"pplx_kernels {where} {name}"


def _spy(monkeypatch, owner, table, calls, prefix=""):
    """Every function of `table` on `owner` records its call after binding it to the
    upstream signature (a TypeError if the adapter passes what upstream does not take)."""
    for name, (_, params) in table.items():
        raw = inspect.getattr_static(owner, name)
        kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        fn = raw.__func__ if kind else raw
        sig = upstream(params)

        def wrapper(*args, _fn=fn, _sig=sig, _name=prefix + name, _kind=kind, **kwargs):
            _sig.bind(*(args[1:] if _kind is classmethod else args), **kwargs)
            calls.append(_name)
            return _fn(*args, **kwargs)
        monkeypatch.setattr(owner, name, kind(wrapper) if kind else wrapper)




def _plan(topk, weights, experts, hidden, dtype):
    from types import SimpleNamespace

    params = {"experts": experts, "hidden": hidden, "dispatch_dtype": dtype}
    return SimpleNamespace(point=SimpleNamespace(params=params), topk=topk, weights=weights, tokens=None,
                           matrix=np.zeros((1, 1)), rank=0, routing_for=None, stride=topk.shape[0])


@pytest.mark.parametrize("mode,dtype", [("normal", "fp8"), ("normal", "bf16"), ("low_latency", "fp8")])
def test_deepep_adapter_through_the_fake_at_world_1(monkeypatch, fakes, gloo_world1, mode, dtype):
    from commbench.benchmarks.moe.gpu_dispatchers import expectations

    deep_ep, _ = fakes
    calls = []
    _spy(monkeypatch, deep_ep.Buffer, DEEPEP, calls)
    eng = (deepep_adapter.DeepEPNormal if mode == "normal" else deepep_adapter.DeepEPLowLatency)(gloo_world1)
    rng = np.random.default_rng(3)
    topk = np.stack([rng.choice(8, 2, replace=False) for _ in range(12)]).astype(np.int64)
    weights = rng.uniform(0.1, 1.0, (12, 2)).astype(np.float32)
    st = eng.setup(topk, weights, 8, 256, dtype, 12)
    eng.fill(st)
    laps = []
    eng.dispatch(st, lambda: laps.append("d"))
    eng.experts(st)
    eng.combine(st, lambda: laps.append("c"))
    want = expectations(_plan(topk, weights, 8, 256, dtype), 1, 0, weighted=mode != "normal")
    assert eng.check(st, want)
    assert eng.library_figures(st) == {"library": "deep_ep fake", "library_recv_rows": 24}
    if mode == "normal":
        assert laps == ["d", "d", "c"]
        assert calls == ["__init__", "get_dispatch_layout", "dispatch", "combine"]
        st.out["combined"][2, 5] += 1  # a wrong sum
    else:
        assert laps == ["d", "c"]
        assert calls == ["get_low_latency_rdma_size_hint", "__init__", "low_latency_dispatch", "low_latency_combine"]
        st.out["recv_count"][0] -= 1  # a row the library says it did not deliver
    assert not eng.check(st, want)
    eng.release(st)
    assert calls[-1] == "destroy" and st.buffer is None


def test_pplx_adapter_calls_fit_the_upstream_signatures(monkeypatch, fakes):
    """pplx's AllToAll needs 2 ranks: a comm that says so, and calls recorded, not run."""
    from types import SimpleNamespace

    _, pplx_kernels = fakes
    calls = []
    _spy(monkeypatch, pplx_kernels, NVSHMEM, calls)
    for name in ("dispatch", "combine"):  # recorded after binding, not run (one process cannot be 2 ranks)
        def record(*args, _sig=upstream(PPLX[name][1]), _name=name, **kwargs):
            _sig.bind(*args, **kwargs)
            calls.append(_name)
        monkeypatch.setattr(pplx_kernels.AllToAll, name, record)
    _spy(monkeypatch, pplx_kernels.AllToAll, {k: PPLX[k] for k in ("intranode", "destroy")}, calls)
    monkeypatch.setattr(pplx_adapter, "_NVSHMEM_UP", [])
    comm = SimpleNamespace(size=2, rank=0, tdev=torch.device("cpu"), group=SimpleNamespace(group_name="0"),
                           node_of_rank=None, allgather_obj=lambda obj: [obj, obj])
    eng = pplx_adapter.PplxAllToAll(comm)
    topk = np.array([[0, 5], [1, 2], [7, 3]], dtype=np.int64)
    st = eng.setup(topk, np.full((3, 2), 0.5, np.float32), 8, 256, "fp8", 3)
    assert st.indices.dtype == torch.uint32 and st.expert_x.shape == (4, 6, 256) and st.expert_x_scale is not None
    eng.fill(st)
    eng.dispatch(st, lambda: None)
    eng.experts(st)
    eng.combine(st, lambda: None)
    eng.release(st)
    assert calls == ["nvshmem_get_unique_id", "nvshmem_init", "intranode", "dispatch", "combine", "destroy"]


def test_the_shared_checks_fail_on_wrong_rows_and_sums():
    x, payload, scales = gpu_lib.token_inputs(1, 6, 6, 256, "fp8", torch.device("cpu"))
    rows = gpu_lib.as_rows(payload, scales)
    want = gpu_lib.expected_rows([(1, np.arange(6))], 6, 256, "fp8", torch.device("cpu"))
    assert gpu_lib.same_rows(rows, want) and gpu_lib.same_rows(rows.flip(0), want, any_order=True)
    assert not gpu_lib.same_rows(rows.flip(0), want)
    swapped = rows.clone()
    swapped[2] = rows[3]  # a row twice, one missing: the same rows in no order
    assert not gpu_lib.same_rows(swapped, want, any_order=True)
    factor = np.array([1.0, 2, 1, 3, 1, 2])
    out = (x.to(torch.float64) * torch.as_tensor(factor).unsqueeze(1)).to(torch.bfloat16)
    assert gpu_lib.combine_ok(out, 1, 6, 6, 256, factor, False)
    assert not gpu_lib.combine_ok(out, 1, 6, 6, 256, factor + np.eye(6)[4], False)
    assert not gpu_lib.combine_ok(out, 1, 6, 6, 256, factor * 1.02, True)


# --- gloo ranks through the CLI, the fakes on PYTHONPATH -------------------------------------

@pytest.mark.slow  # a launch whose plumbing the in-process tests cover: make test-slow
@pytest.mark.multirank
def test_gloo_library_dispatchers_pass_the_exact_check_against_the_fakes(tmp_path):
    out = tmp_path / "gpu"
    p = run_cli("run", "-b", "moe", "--backend", "gloo", "--np", 2, "--check", "--iters", 2, "--warmup", 1,
                "--out", out, *SMALL, "--param", "moe.dispatcher=deepep,deepep-ll,pplx",
                "--param", "moe.routing=uniform,source_ragged",
                env={"PYTHONPATH": str(FAKES), gpu_lib.FAKE_ENV: "1"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    df = load(out)
    assert len(df) == 3 * 2 * 2 and (df["check"] == "ok").all(), df[["params", "stage", "check"]]
    assert set(df["library"]) == {"deep_ep fake", "pplx_kernels fake"}
    assert df["library_note"].str.contains("unverified on a GPU").all()
    assert (df["library_recv_rows"] > 0).all()
    engines = {"deepep": "deep_ep", "deepep-ll": "deep_ep", "pplx": "pplx_kernels"}
    assert all(r["engine"] == engines[r["params"]["dispatcher"]] for _, r in df.iterrows())
    assert {r["params"]["dispatcher"] for _, r in df.iterrows()} == set(engines)


@pytest.mark.slow  # a launch whose plumbing the in-process tests cover: make test-slow
@pytest.mark.multirank
def test_without_the_switch_the_library_dispatchers_are_skipped_on_gloo(tmp_path):
    out = tmp_path / "skip"
    p = run_cli("run", "-b", "moe", "--backend", "gloo", "--np", 2, "--iters", 2, "--out", out, *SMALL,
                "--param", "moe.dispatcher=deepep,pplx,allgather",
                env={"PYTHONPATH": str(FAKES), gpu_lib.FAKE_ENV: "0"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert p.stdout.count("needs CUDA (device cuda, backend nccl)") + p.stderr.count("needs CUDA") >= 2
    df = load(out)
    assert {q["dispatcher"] for q in df["params"]} == {"allgather"}
