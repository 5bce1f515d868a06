"""What the GPU library adapters (deepep_adapter.py, pplx_adapter.py) share: whether a
library can run here, the tokens in the forms the libraries take, and the checks that
compare what they return with what the routing says (the torch path's expectations).

Importing this module imports neither torch nor a library: `why_not` is asked on every
backend, mpi included, before anything runs.

COMMBENCH_FAKE_GPU_LIBS=1 is set only by the tests (tests/backends/test_gpu_dispatch_adapters.py):
it lets the adapters run on gloo with CPU tensors, so their plumbing runs against the
fakes in tests/fixtures/fake_gpu_libs, which follow the libraries' public signatures. With
the real libraries the adapters need CUDA and nccl.
"""
from __future__ import annotations

import importlib
import os

import numpy as np

FAKE_ENV = "COMMBENCH_FAKE_GPU_LIBS"


def fakes_allowed() -> bool:
    return os.environ.get(FAKE_ENV) == "1"


def device_why_not(backend: str, device: str) -> str | None:
    if backend == "nccl" and device == "cuda":
        return None
    if fakes_allowed() and backend == "gloo" and device == "cpu":
        return None
    return "needs CUDA (device cuda, backend nccl)"


def import_why_not(module: str) -> str | None:
    """None when `module` imports; else one line saying why not."""
    try:
        importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 (an extension's load error is any type: report it)
        first = (str(e).splitlines() or [""])[0]
        return f"the {module} library does not import: {type(e).__name__}: {first}".rstrip(": ")
    return None


def library_label(module: str) -> str:
    mod = importlib.import_module(module)
    return f"{module} {getattr(mod, '__version__', '')}".strip()


def num_nodes(comm) -> int:
    nodes = getattr(comm, "node_of_rank", None)
    return 1 if nodes is None else len(set(np.asarray(nodes)[:comm.size].tolist()))


# --- tokens in the libraries' forms (torch from here on) ---------------------------------

def token_inputs(rank: int, num_tokens: int, stride: int, hidden: int, dtype: str, device):
    """(bf16 activations (T, H), payload, scales): payload is the fp8 float8_e4m3fn (T, H)
    and scales fp32 (T, H/128) for fp8 (DeepEP's and pplx's (x, x_scale) form, exact for
    these activations: torch_normal.token_activations, whose token ids run rank * stride +
    token), or the bf16 activations and None."""
    import torch

    from .torch_normal import token_activations, token_rows

    idx = torch.arange(num_tokens, device=device)
    x = token_activations(rank, idx, stride, hidden)
    if dtype != "fp8":
        return x, x, None
    rows = token_rows(rank, idx, stride, hidden, dtype)
    return x, rows[:, :hidden].contiguous().view(torch.float8_e4m3fn), rows[:, hidden:].contiguous().view(torch.float32)


def as_rows(payload, scales):
    """Received (payload, scales) as the engines' dispatch rows: uint8 (n, row bytes)."""
    import torch

    n = payload.shape[0]
    if scales is None:
        return payload.contiguous().view(torch.uint8).view(n, -1)
    return torch.cat([payload.contiguous().view(torch.uint8).view(n, -1),
                      scales.contiguous().view(torch.uint8).view(n, -1)], dim=1)


def dequantised(payload, scales, hidden: int, dtype: str):
    """bf16 (n, H): what an identity expert returns for received rows."""
    import torch

    from .torch_normal import decode_rows

    out = torch.empty((payload.shape[0], hidden), dtype=torch.bfloat16, device=payload.device)
    decode_rows(as_rows(payload, scales), hidden, dtype, out)
    return out


def expected_rows(sources, stride: int, hidden: int, dtype: str, device):
    """uint8 rows every (source rank, token indices) pair would send, concatenated."""
    import torch

    from .torch_normal import row_nbytes, token_rows

    parts = [token_rows(src, torch.as_tensor(np.asarray(idx, dtype=np.int64)).to(device), stride, hidden, dtype)
             for src, idx in sources]
    return torch.cat(parts) if parts else torch.empty((0, row_nbytes(hidden, dtype)), dtype=torch.uint8, device=device)


def same_rows(got, want, any_order: bool = False) -> bool:
    """Row for row equal; any_order: equal as multisets (a library that lands an expert's
    rows in arrival order, pplx-kernels, says nothing about which slot holds which)."""
    if tuple(got.shape) != tuple(want.shape):
        return False
    if not any_order:
        return bool((got == want).all())
    g, w = got.cpu().numpy(), want.cpu().numpy()
    as_void = np.dtype((np.void, g.shape[1] if g.ndim == 2 and g.shape[1] else 1))
    return bool(np.array_equal(np.sort(np.ascontiguousarray(g).view(as_void).ravel()),
                               np.sort(np.ascontiguousarray(w).view(as_void).ravel())))


def combine_ok(out, rank: int, num_tokens: int, stride: int, hidden: int, factor: np.ndarray,
               weighted: bool) -> bool:
    """combine(dispatch(x)) through identity experts is x times `factor` per token, as on
    the torch path, read at the library's output precision (bf16): exactly when unweighted
    (x times a small integer is exact in bf16 up to 16 copies), within bf16's rounding
    (rtol 2^-8) when weighted."""
    import torch

    from .torch_normal import token_activations

    x = token_activations(rank, torch.arange(num_tokens, device=out.device), stride, hidden)
    f = torch.as_tensor(np.asarray(factor, dtype=np.float64)).to(out.device)
    expect = (x.to(torch.float64) * f.unsqueeze(1)).to(torch.float32)
    got = out[:num_tokens].to(torch.float32)
    if got.shape != expect.shape:
        return False
    if weighted:
        return bool(torch.allclose(got, expect, rtol=2.0 ** -8, atol=0))
    return bool(torch.equal(got, expect.to(torch.bfloat16).to(torch.float32)))
