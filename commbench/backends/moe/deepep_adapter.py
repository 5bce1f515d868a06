"""DeepEP's `deep_ep.Buffer` as MoE engines: normal mode (get_dispatch_layout, dispatch,
combine: rank copies, unweighted combine) and low-latency mode (low_latency_dispatch,
low_latency_combine: expert copies, fixed slots, weighted combine).

The calls mirror the public API of deepseek-ai/DeepEP deep_ep/buffer.py at commit
92fe2deaec24 (the main branch exports the same `Buffer` from deep_ep/buffers/legacy.py):
  Buffer.__init__                     buffer.py:32-43
  get_low_latency_rdma_size_hint      buffer.py:176
  get_dispatch_layout                 buffer.py:293-320 (returns 5: per-rank, per-RDMA-rank,
                                      per-expert counts, is_token_in_rank, event)
  dispatch                            buffer.py:322-403 (returns 6: recv_x, recv_topk_idx,
                                      recv_topk_weights, per-local-expert list, handle, event)
  combine                             buffer.py:405-451 (returns 3; sums without weights)
  low_latency_dispatch                buffer.py:548-615 (returns 5: recv_x, recv_count,
                                      handle, event, hook)
  low_latency_combine                 buffer.py:617-661 (returns 3; sums with weights)
  destroy                             buffer.py:138 (explicitly_destroy=True)
and the way tests/test_intranode.py (buffer at lines 273-281, dispatch 97-113, combine
168-177) and tests/test_low_latency.py (buffer 258-268, dispatch 96-102, combine 156-165)
drive them. Nothing here has run on a GPU: the plumbing is tested on CPU against the fake
in tests/fixtures/fake_gpu_libs/deep_ep (gpu_lib.py says how).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .gpu_lib import (
    as_rows,
    combine_ok,
    dequantised,
    device_why_not,
    expected_rows,
    import_why_not,
    library_label,
    num_nodes,
    same_rows,
    token_inputs,
)

# Buffer sizes of DeepEP's own tests: 2e9 NVLink bytes (test_intranode.py:273-275), 1e9
# RDMA bytes across nodes (tests/test_internode.py).
NVL_NBYTES = int(2e9)
RDMA_NBYTES = int(1e9)


def why_not(backend: str, device: str, nodes: int, params: dict) -> str | None:
    return device_why_not(backend, device) or import_why_not("deep_ep")


@dataclass
class DeepEPState:
    rank: int
    world: int
    num_experts: int
    num_tokens: int
    hidden: int
    dtype: str
    t_max: int
    stride: int               # token ids' stride (torch_normal.token_activations)
    buffer: object
    x: object                 # bf16 (T, H)
    x_in: object              # what dispatch takes: bf16 (T, H) or (fp8 (T, H), fp32 scales (T, H/128))
    topk: object              # int64 (T, K)
    weights: object           # float32 (T, K)
    out: dict = field(default_factory=dict)   # the library's returns, by name


class DeepEPNormal:
    """Normal mode: one row per (token, destination rank), the host waits inside dispatch
    for the received count (DeepEP's CPU sync), combine sums the returned rows."""

    method = "deep_ep.Buffer get_dispatch_layout + dispatch, combine (normal kernels)"
    low_latency = False

    def __init__(self, comm):
        self.comm = comm

    def _group(self):
        return self.comm.group if self.comm.group is not None else self.comm.dist.group.WORLD

    def _buffer(self, num_experts: int, hidden: int, t_max: int):
        import deep_ep

        rdma = RDMA_NBYTES if num_nodes(self.comm) > 1 else 0
        return deep_ep.Buffer(self._group(), num_nvl_bytes=NVL_NBYTES, num_rdma_bytes=rdma, low_latency_mode=False,
                              num_qps_per_rank=1, explicitly_destroy=True)

    def setup(self, topk: np.ndarray, weights: np.ndarray, num_experts: int, hidden: int, dtype: str,
              t_max: int, stride: int = 0) -> DeepEPState:
        import torch

        dev, rank = self.comm.tdev, self.comm.rank
        n = int(topk.shape[0])
        stride = stride or t_max
        x, payload, scales = token_inputs(rank, n, stride, hidden, dtype, dev)
        return DeepEPState(rank, self.comm.size, num_experts, n, hidden, dtype, t_max, stride,
                           self._buffer(num_experts, hidden, t_max), x,
                           payload if scales is None else (payload, scales),
                           torch.as_tensor(np.ascontiguousarray(topk), dtype=torch.int64).to(dev),
                           torch.as_tensor(np.ascontiguousarray(weights), dtype=torch.float32).to(dev))

    def fill(self, st: DeepEPState) -> None:
        st.out.clear()

    def release(self, st: DeepEPState) -> None:
        if st.buffer is not None:
            st.buffer.destroy()
            st.buffer = None

    # --- stages ---------------------------------------------------------------------
    def layout(self, st: DeepEPState) -> None:
        per_rank, per_rdma_rank, per_expert, in_rank, _ = st.buffer.get_dispatch_layout(st.topk, st.num_experts)
        st.out["layout"] = (per_rank, per_rdma_rank, per_expert, in_rank)

    def exchange(self, st: DeepEPState) -> None:
        per_rank, per_rdma_rank, per_expert, in_rank = st.out["layout"]
        recv_x, recv_topk_idx, recv_topk_weights, per_local_expert, handle, _ = st.buffer.dispatch(
            x=st.x_in, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma_rank,
            is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, topk_idx=st.topk, topk_weights=st.weights)
        st.out.update(recv_x=recv_x, per_local_expert=list(per_local_expert), handle=handle)

    def dispatch(self, st: DeepEPState, lap) -> None:
        for stage in (self.layout, self.exchange):
            stage(st)
            lap()

    def experts(self, st: DeepEPState) -> None:
        recv = st.out["recv_x"]
        payload, scales = recv if isinstance(recv, tuple) else (recv, None)
        st.out["expert_out"] = dequantised(payload, scales, st.hidden, st.dtype)

    def combine(self, st: DeepEPState, lap) -> None:
        combined, _, _ = st.buffer.combine(x=st.out["expert_out"], handle=st.out["handle"])
        st.out["combined"] = combined
        lap()

    # --- checks (untimed) -------------------------------------------------------------
    def check(self, st: DeepEPState, expected: dict) -> bool:
        """The received rows (as a multiset: slot order is the library's), DeepEP's own
        per-local-expert counts, and combine(dispatch(x)) = x times the destination
        ranks of each token (DeepEP's normal combine sums without weights)."""
        recv = st.out.get("recv_x")
        if recv is None or "combined" not in st.out:
            return False
        payload, scales = recv if isinstance(recv, tuple) else (recv, None)
        want = expected_rows(expected["sources"], st.stride, st.hidden, st.dtype, payload.device)
        return (same_rows(as_rows(payload, scales), want, any_order=True)
                and [int(c) for c in st.out["per_local_expert"]] == [int(c) for c in expected["per_local_expert"]]
                and combine_ok(st.out["combined"], st.rank, st.num_tokens, st.stride, st.hidden, expected["factor"],
                               False))

    def library_figures(self, st: DeepEPState) -> dict:
        return {"library": library_label("deep_ep"),
                "library_recv_rows": int(sum(int(c) for c in st.out.get("per_local_expert", [])))}


class DeepEPLowLatency(DeepEPNormal):
    """Low-latency mode: one row per (token, expert) into fixed slots per local expert
    (t_max * world of them), no host sync; combine sums with the routing weights."""

    method = "deep_ep.Buffer low_latency_dispatch, low_latency_combine"
    low_latency = True

    def _buffer(self, num_experts: int, hidden: int, t_max: int):
        import deep_ep

        world = self.comm.size
        rdma = deep_ep.Buffer.get_low_latency_rdma_size_hint(t_max, hidden, world, num_experts)
        return deep_ep.Buffer(self._group(), num_rdma_bytes=rdma, low_latency_mode=True,
                              num_qps_per_rank=num_experts // world, explicitly_destroy=True)

    def exchange(self, st: DeepEPState) -> None:
        recv_x, recv_count, handle, _, _ = st.buffer.low_latency_dispatch(
            st.x, st.topk, st.t_max, st.num_experts, use_fp8=st.dtype == "fp8", async_finish=False,
            return_recv_hook=False)
        st.out.update(recv_x=recv_x, recv_count=recv_count, handle=handle)

    def dispatch(self, st: DeepEPState, lap) -> None:
        self.exchange(st)
        lap()

    def experts(self, st: DeepEPState) -> None:
        recv = st.out["recv_x"]
        payload, scales = recv if isinstance(recv, tuple) else (recv, None)
        local, slots = payload.shape[0], payload.shape[1]
        flat_scales = None if scales is None else scales.reshape(local * slots, -1)
        y = dequantised(payload.reshape(local * slots, st.hidden), flat_scales, st.hidden, st.dtype)
        st.out["expert_out"] = y.view(local, slots, st.hidden)

    def combine(self, st: DeepEPState, lap) -> None:
        combined, _, _ = st.buffer.low_latency_combine(st.out["expert_out"], st.topk, st.weights, st.out["handle"],
                                                       async_finish=False, return_recv_hook=False)
        st.out["combined"] = combined
        lap()

    def check(self, st: DeepEPState, expected: dict) -> bool:
        """Per local expert: the library's count, the first `count` slots as a multiset of
        the rows its sources route there; combine(dispatch(x)) = x times the weight sum."""
        recv = st.out.get("recv_x")
        if recv is None or "combined" not in st.out:
            return False
        payload, scales = recv if isinstance(recv, tuple) else (recv, None)
        counts = [int(c) for c in st.out["recv_count"].tolist()]
        for e, sources in enumerate(expected["by_expert"]):
            n = counts[e] if e < len(counts) else -1
            want = expected_rows(sources, st.stride, st.hidden, st.dtype, payload.device)
            if n != want.shape[0]:
                return False
            got = as_rows(payload[e, :n], None if scales is None else scales[e, :n])
            if not same_rows(got, want, any_order=True):
                return False
        return combine_ok(st.out["combined"], st.rank, st.num_tokens, st.stride, st.hidden, expected["factor"], True)

    def library_figures(self, st: DeepEPState) -> dict:
        count = st.out.get("recv_count")
        return {"library": library_label("deep_ep"),
                "library_recv_rows": 0 if count is None else int(count.sum().item())}
