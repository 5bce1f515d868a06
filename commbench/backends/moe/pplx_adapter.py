"""pplx-kernels' `pplx_kernels.AllToAll` as a MoE engine: one row per (token, expert) into
fixed slots per local expert (max_num_tokens * world of them), over NVSHMEM; combine sums
the expert outputs with the routing weights.

The calls mirror the public API of ppl-ai/pplx-kernels at commit 12cecfda252e:
  src/pplx_kernels/all_to_all.py  AllToAll.intranode 88-126 (one node), AllToAll.internode
                                  128-164 (across nodes), dispatch 27-59, combine 61-81,
                                  destroy 83-86; all return None and write into the
                                  tensors they are given
  src/pplx_kernels/nvshmem.py     nvshmem_get_unique_id 12, nvshmem_alloc_empty_unique_id
                                  20, nvshmem_init 24 (once per process)
and the way tests/test_all_to_all.py drives them (create 63-103, dispatch buffers 153-175,
dispatch 180-190 with indices as uint32, combine 253-270, the uid broadcast 298-300).
dp_size is 1 (every rank its own data-parallel group), so AllToAll needs world >= 2.
Nothing here has run on a GPU: the plumbing is tested on CPU against the fake in
tests/fixtures/fake_gpu_libs/pplx_kernels (gpu_lib.py says how).
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

_NVSHMEM_UP = []  # nvshmem_init runs once per process; the comm it ran for


def why_not(backend: str, device: str, nodes: int, params: dict) -> str | None:
    return device_why_not(backend, device) or import_why_not("pplx_kernels")


@dataclass
class PplxState:
    rank: int
    world: int
    num_experts: int
    num_tokens: int
    hidden: int
    dtype: str
    t_max: int
    stride: int               # token ids' stride (torch_normal.token_activations)
    ata: object
    dp_x: object
    dp_x_scale: object
    indices: object            # uint32 (T, K)
    weights: object            # float32 (T, K)
    bound_m: object            # uint32 (1,): this rank's tokens
    expert_num_tokens: object  # int32 (local,)
    expert_x: object           # (local, t_max * world, H)
    expert_x_scale: object     # fp8: fp32 (local, t_max * world, H / 128)
    out_tokens: object         # bf16 (t_max, H)
    out: dict = field(default_factory=dict)


class PplxAllToAll:
    method = "pplx_kernels.AllToAll dispatch, combine (NVSHMEM)"

    def __init__(self, comm):
        self.comm = comm

    def _init_nvshmem(self) -> None:
        import torch
        from pplx_kernels import nvshmem_alloc_empty_unique_id, nvshmem_get_unique_id, nvshmem_init

        if _NVSHMEM_UP:
            return
        uid = nvshmem_get_unique_id() if self.comm.rank == 0 else nvshmem_alloc_empty_unique_id()
        shared = self.comm.allgather_obj(uid.tolist() if self.comm.rank == 0 else None)[0]
        nvshmem_init(torch.tensor(shared, dtype=torch.uint8), self.comm.rank, self.comm.size)
        _NVSHMEM_UP.append(True)

    def setup(self, topk: np.ndarray, weights: np.ndarray, num_experts: int, hidden: int, dtype: str,
              t_max: int, stride: int = 0) -> PplxState:
        import torch
        from pplx_kernels import AllToAll

        comm, dev = self.comm, self.comm.tdev
        world, rank = comm.size, comm.rank
        if world < 2:
            raise RuntimeError("pplx-kernels' AllToAll needs at least 2 ranks (world_size // dp_size > 1)")
        self._init_nvshmem()
        fp8 = dtype == "fp8"
        args = dict(max_num_tokens=t_max, num_experts=num_experts, experts_per_token=int(topk.shape[1]), rank=rank,
                    world_size=world, dp_size=1, hidden_dim=hidden, hidden_dim_bytes=hidden * (1 if fp8 else 2),
                    hidden_dim_scale_bytes=(hidden // 128) * 4 if fp8 else 0)
        if num_nodes(comm) > 1:
            ata = AllToAll.internode(**args)
        else:
            group = comm.group if comm.group is not None else comm.dist.group.WORLD
            ata = AllToAll.intranode(**args, group_name=group.group_name)
        n, local, slots = int(topk.shape[0]), num_experts // world, t_max * world
        stride = stride or t_max
        _, payload, scales = token_inputs(rank, n, stride, hidden, dtype, dev)
        return PplxState(
            rank, world, num_experts, n, hidden, dtype, t_max, stride, ata, payload, scales,
            torch.as_tensor(np.ascontiguousarray(topk), dtype=torch.int64).to(dev).to(torch.uint32),
            torch.as_tensor(np.ascontiguousarray(weights), dtype=torch.float32).to(dev),
            torch.tensor([n], dtype=torch.uint32, device=dev),
            torch.empty(local, dtype=torch.int32, device=dev),
            torch.empty((local, slots, hidden), dtype=payload.dtype, device=dev),
            torch.empty((local, slots, hidden // 128), dtype=torch.float32, device=dev) if fp8 else None,
            torch.empty((t_max, hidden), dtype=torch.bfloat16, device=dev))

    def fill(self, st: PplxState) -> None:
        st.out.clear()
        st.expert_num_tokens.zero_()

    def release(self, st: PplxState) -> None:
        if st.ata is not None:
            st.ata.destroy()
            st.ata = None

    def dispatch(self, st: PplxState, lap) -> None:
        st.ata.dispatch(out_expert_num_tokens=st.expert_num_tokens, out_expert_x=st.expert_x,
                        out_expert_x_scale=st.expert_x_scale, dp_x=st.dp_x, dp_x_scale=st.dp_x_scale,
                        indices=st.indices, bound_m=st.bound_m)
        lap()

    def experts(self, st: PplxState) -> None:
        """Identity experts: every slot dequantised to bf16 (the slots past an expert's
        count are never read back by combine)."""
        local, slots = st.expert_x.shape[0], st.expert_x.shape[1]
        scales = None if st.expert_x_scale is None else st.expert_x_scale.reshape(local * slots, -1)
        y = dequantised(st.expert_x.reshape(local * slots, st.hidden), scales, st.hidden, st.dtype)
        st.out["expert_y"] = y.view(local, slots, st.hidden)

    def combine(self, st: PplxState, lap) -> None:
        st.ata.combine(out_tokens=st.out_tokens, indices=st.indices, weights=st.weights, expert_y=st.out["expert_y"],
                       bound_m=st.bound_m)
        st.out["combined"] = st.out_tokens
        lap()

    def check(self, st: PplxState, expected: dict) -> bool:
        """Per local expert: the library's count and the first `count` slots as a multiset
        of the rows its sources route there (pplx-kernels lands them in arrival order);
        combine(dispatch(x)) = x times the weight sum."""
        if "combined" not in st.out:
            return False
        counts = [int(c) for c in st.expert_num_tokens.tolist()]
        for e, sources in enumerate(expected["by_expert"]):
            want = expected_rows(sources, st.stride, st.hidden, st.dtype, st.expert_x.device)
            if counts[e] != want.shape[0]:
                return False
            n = counts[e]
            got = as_rows(st.expert_x[e, :n], None if st.expert_x_scale is None else st.expert_x_scale[e, :n])
            if not same_rows(got, want, any_order=True):
                return False
        return combine_ok(st.out["combined"], st.rank, st.num_tokens, st.stride, st.hidden, expected["factor"], True)

    def library_figures(self, st: PplxState) -> dict:
        return {"library": library_label("pplx_kernels"), "library_recv_rows": int(st.expert_num_tokens.sum().item())}
