"""torch.distributed backend: gloo on CPU, nccl on CUDA."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import weakref

import numpy as np

from commbench.backends.gpuhold import hold_cap_s, make_holds
from commbench.backends.gpus import SHARED_GPU_MARK, shared_gpu_hostids
from commbench.backends.timing import (
    NoHold,
    choose_ops_per_batch,
    choose_ops_per_replay,
    time_held,
    time_steps_with_events,
    time_with_events,
    time_with_graph,
)
from commbench.core.errors import UsageError

from .base import Comm, Handle

# commbench dtype -> cupy.cuda.nccl's name for it.
_NCCL_TYPES = {"float32": "NCCL_FLOAT32", "float16": "NCCL_FLOAT16", "bfloat16": "NCCL_BFLOAT16",
               "int32": "NCCL_INT32"}


class TorchComm(Comm):
    def __init__(self, group, rank, size, backend: str, device: str, host_group=None):
        import torch
        import torch.distributed as dist

        super().__init__(rank, size)
        self.torch = torch
        self.dist = dist
        self.group = group
        self.backend = backend
        self.device = device
        self.tdev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
        self.timing_method = "cuda_event" if device == "cuda" else "host_clock"
        # The symm-mem variant: buffers in symmetric memory and all_reduce by multimem
        # (NVLink SHARP driven from torch, torch.distributed._symmetric_memory).
        self.symm_mem = device == "cuda" and os.environ.get("COMMBENCH_SYMM_MEM") == "1"
        # CUDA-graph timing: operations per replay (None: chosen from the warm-up, see
        # timing.choose_ops_per_replay) and the count the last timed call used.
        self.graph_ops_per_replay: int | None = None
        self.last_ops_per_replay: int | None = None
        self._warm_stream = None
        # Held-batch timing (CUDA): the hold factory, made on first use; the device time of the
        # op last sized; the gloo group the ranks meet on before a release.
        self._hold_factory, self._hold_method, self._hold_fallback = None, None, None
        self._batch_for, self._op_s = None, float("nan")
        # Ops and steps already run once unheld (a first call may block the host until the
        # device drains: lazy module loading, cuBLAS's first handle, NCCL's connection
        # set-up), and those whose hold ran out once: timed unheld from then on. Both by
        # identity, and a point prepares its own ops and steps, so both last one point.
        self._warmed = _IdentitySet()
        self._expired = _IdentitySet()
        self.host_group = host_group
        # Ranks sharing one GPU by the opt-in (gpus.SHARED_GPU_ENV): every GPU row says so.
        self.shared_gpu = device == "cuda" and shared_gpu_hostids() is not None
        self.last_timing: dict = {}
        self._dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                        "int32": torch.int32, "float64": torch.float64, "uint8": torch.uint8}
        self._names = {t: n for n, t in self._dtypes.items()}
        self._nccl = None  # cupy's NCCL communicator (out-of-place all_reduce), made on first use
        # all_gather_single replaces all_gather_into_tensor in newer torch.
        self._all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    # --- memory -----------------------------------------------------------------
    def alloc(self, count, dtype):
        if self.symm_mem:
            import torch.distributed._symmetric_memory as symm_mem

            return symm_mem.empty(count, dtype=self._dtypes[dtype], device=self.tdev)
        return self.torch.empty(count, dtype=self._dtypes[dtype], device=self.tdev)

    def fill(self, buf, values):
        buf.copy_(self.torch.from_numpy(np.ascontiguousarray(values)).to(buf.dtype))

    def to_numpy(self, buf):
        return buf.detach().to("cpu", self.torch.float64).numpy()

    def host_view(self, buf):
        if self.device != "cpu":
            raise UsageError("host_view needs CPU buffers")
        return buf.numpy()

    # --- prepared operations ----------------------------------------------------
    def out_of_place_all_reduce(self, dtype: str) -> bool:
        """torch.distributed reduces in place only; on CUDA, cupy.cuda.nccl drives the same
        NCCL with the out-of-place call (COMMBENCH_CUPY_NCCL=0 turns that off)."""
        if self.device != "cuda" or self.symm_mem or os.environ.get("COMMBENCH_CUPY_NCCL") == "0":
            return False
        try:
            from cupy.cuda import nccl
        except Exception:  # noqa: BLE001 (no cupy, or a cupy without NCCL: in place it is)
            return False
        return getattr(nccl, _NCCL_TYPES.get(dtype, ""), None) is not None

    def _cupy_nccl(self):
        """One cupy NcclCommunicator over this group's ranks (created collectively, on the
        first out-of-place all_reduce of the group)."""
        if self._nccl is None:
            from cupy.cuda import nccl

            uid = self.allgather_obj(nccl.get_unique_id() if self.rank == 0 else None)[0]
            self._nccl = (nccl, nccl.NcclCommunicator(self.size, uid, self.rank))
        return self._nccl

    def all_reduce(self, send, recv, in_place=False):
        if not in_place and self.out_of_place_all_reduce(self._names.get(recv.dtype, "")):
            nccl, comm = self._cupy_nccl()
            dtype = getattr(nccl, _NCCL_TYPES[self._names[recv.dtype]])
            s_ptr, r_ptr, count, current = send.data_ptr(), recv.data_ptr(), send.numel(), self.torch.cuda.current_stream

            def run():  # the stream is read at each call: a graph capture changes it
                comm.allReduce(s_ptr, r_ptr, count, dtype, nccl.NCCL_SUM, current().cuda_stream)
            return run
        # torch.distributed's all_reduce reduces recv in place (AllReduce fills it with the
        # input), nccl-tests' in-place column.
        if self.symm_mem:
            import torch.distributed._symmetric_memory as symm_mem

            name = (self.group or self.dist.group.WORLD).group_name
            symm_mem.rendezvous(recv, name)
            return functools.partial(self.torch.ops.symm_mem.multimem_all_reduce_, recv, "sum", name)
        return functools.partial(self.dist.all_reduce, recv, group=self.group)

    def reduce_scatter(self, send, recv):
        return functools.partial(self._reduce_scatter, recv, send, group=self.group)

    def all_gather(self, send, recv):
        return functools.partial(self._all_gather, recv, send, group=self.group)

    def all_to_all(self, send, recv, send_counts=None, recv_counts=None):
        return functools.partial(self.dist.all_to_all_single, recv, send,
                                 None if recv_counts is None else [int(c) for c in recv_counts],
                                 None if send_counts is None else [int(c) for c in send_counts],
                                 group=self.group)

    def broadcast(self, buf, root):
        # Sub-groups are always ranks 0..n-1, so group rank == global rank.
        return functools.partial(self.dist.broadcast, buf, root, group=self.group)

    def send_recv(self, send, recv, peer):
        dist = self.dist
        ops = [dist.P2POp(dist.isend, send, peer, self.group), dist.P2POp(dist.irecv, recv, peer, self.group)]

        def run():
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        return run

    def barrier_op(self):
        op = functools.partial(self.dist.barrier, group=self.group)
        # ProcessGroupNCCL's barrier work synchronizes the current stream in wait(): behind a
        # hold the host would stall until the hold's cap, so time_ops never holds it.
        op.host_waits = self.device == "cuda"
        return op

    def iall_reduce(self, send, recv):
        work = self.dist.all_reduce(recv, group=self.group, async_op=True)
        return Handle(work.wait, work.is_completed)

    # --- control ----------------------------------------------------------------
    def sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def max_over_ranks(self, values):
        t = self.torch.tensor(np.asarray(values, dtype=np.float64), device=self.tdev)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.group)
        return t.cpu().numpy()

    def allgather_obj(self, obj):
        out = [None] * self.size
        self.dist.all_gather_object(out, obj, group=self.group)
        return out

    def time_ops(self, op, iters, barrier_each=False, cuda_graph=False, per_op_events=False):
        """CPU: the host clock (Comm.time_ops). CUDA: device time only (timing.time_held):
        the stream is held while the host enqueues a batch, the ranks meet on the host, then
        release; a sample is the batch's mean per operation (per_op_events: one event pair
        per operation instead). barrier_each (OSU's method): batches of one operation, so
        every operation starts together on every rank. cuda_graph: operations captured in
        one CUDA graph, each held replay one sample, divided by the operations it holds.

        Never held: an op that waits for the device on the host (op.host_waits: the nccl
        barrier), and an op whose hold ran out once in this point; both are timed with an
        event pair each on an idle stream, and their rows say why. Every op runs once
        unheld, the device drained after it, before its first held batch.
        self.last_timing: the row fields that say how the samples were taken."""
        if self.device != "cuda":  # spec.check_backend refuses cuda_graph off CUDA
            return super().time_ops(op, iters, barrier_each)
        out = self._time_ops_cuda(op, iters, barrier_each, cuda_graph, per_op_events)
        self._mark_shared()
        return out

    def _mark_shared(self) -> None:
        if self.shared_gpu:
            self.last_timing["shared_gpu"] = SHARED_GPU_MARK

    def _time_ops_cuda(self, op, iters, barrier_each, cuda_graph, per_op_events):
        torch = self.torch
        holds = self._holds()
        if getattr(op, "host_waits", False) or (op in self._expired and not cuda_graph):
            why = ("it waits for the device on the host (a hold would stall it until the cap)"
                   if getattr(op, "host_waits", False) else self._expired_why())
            return self._time_unheld(op, iters, barrier_each, why)
        self._first_unheld(op)
        if not cuda_graph:
            self.last_ops_per_replay = None
            # per_op_events: an event pair around each operation of a held batch of the usual
            # size (docs/gpu-timing.md), so iters samples take ceil(iters / n) batches.
            n = 1 if barrier_each else choose_ops_per_batch(self._device_op_s(op))
            if op in self._expired:  # the sizing batch's hold ran out
                return self._time_unheld(op, iters, barrier_each, self._expired_why())
            batches = -(-int(iters) // n) if per_op_events else iters
            r = time_held(op, batches, n, holds, self._event, torch.cuda.synchronize, meet=self._meet,
                          per_op=per_op_events)
            if per_op_events:
                r = dataclasses.replace(r, samples_s=r.samples_s[:iters], held=r.held[:iters])
            if self._ran_out(self._uncovered(r.held.all())):
                self._expired.add(op)
            self.last_timing = {**r.info(), **self._hold_fields(),
                                "clock": "cuda_event_held" if self._hold_method != "none" else "cuda_event"}
            return r.samples_s
        info: dict = {}
        held: list = []
        hold_for = holds if op not in self._expired else NoHold

        def time_replays(replay, n):
            res = time_held(replay, n, 1, hold_for, self._event, torch.cuda.synchronize, meet=self._meet)
            held.append(res)
            return res.samples_s
        # Operations per replay from the op's device time (a held batch), not from eager events,
        # which read the host's launch cost and would make replays too short for their pair.
        per_replay = self.graph_ops_per_replay or choose_ops_per_replay(self._device_op_s(op))
        times = time_with_graph(op, iters, per_replay, self._capture, self._replay, self._event,
                                torch.cuda.synchronize, side_stream=self._side_stream, info=info,
                                time_replays=time_replays)
        if "ops_per_replay" in info:
            k = self.last_ops_per_replay = info["ops_per_replay"]
            r = held[-1].info() if held else {}
            host = r.get("host_us_per_op")
            r.update(ops_per_sample=k, sample=f"mean of the {k} operations of one held CUDA-graph replay; "
                                              f"percentiles over replays",
                     host_us_per_op=None if host is None else host / k, **self._hold_fields())
            if hold_for is NoHold and holds is not NoHold:  # expired, not COMMBENCH_NO_HOLD=1
                r["unheld_reason"] = self._expired_why()
            self.last_timing = r
        return times

    def _ran_out(self, mine: bool) -> bool:
        """Did a hold run out on any rank? Every rank must then time the op unheld alike (a
        held batch meets the other ranks on the host; an unheld one does not)."""
        if self.size > 1:
            return bool(self.max_over_ranks(np.array([float(mine)]))[0] > 0)
        return bool(mine)

    def _uncovered(self, all_held: bool) -> bool:
        """A hold ran out (on this rank). Never where nothing holds by design
        (COMMBENCH_NO_HOLD=1: NoHold.covered() reads False, which is no expiry)."""
        return self._hold_method != "none" and not all_held

    def _hold_fields(self) -> dict:
        out = {"hold_method": self._hold_method}
        if self._hold_fallback:
            out["hold_fallback"] = self._hold_fallback
        if self._hold_method == "none" and self._hold_factory is NoHold:
            out["unheld_reason"] = f"{NO_HOLD_ENV}=1: events on an idle stream, no hold (a diagnostic)"
        return out

    def _expired_why(self) -> str:
        return (f"its hold ran out once (cap {hold_cap_s():g} s, {HOLD_CAP_HINT}): timed unheld for the rest "
                f"of this point")

    def _time_unheld(self, op, iters, barrier_each, why: str):
        """An event pair around each call on an idle stream: the host's launch cost is in the
        samples, and the row says so and why."""
        torch = self.torch
        self.last_ops_per_replay = None
        between = self.barrier_op() if barrier_each else None
        t = time_with_events(op, iters, self._event, torch.cuda.synchronize, between=between)
        self.last_timing = {"ops_per_sample": 1, "sample": "one operation between an event pair on an idle stream",
                            "held": False, "unheld_samples": int(iters), "clock": "cuda_event",
                            **self._hold_fields(), "unheld_reason": why}
        if getattr(op, "host_waits", False):
            self.last_timing["hold_method"] = "none"  # by design: nothing to warn about
        return t

    def _first_unheld(self, fn, run=None) -> None:
        """fn's first call, unheld, then the device drained: whatever a first launch does on
        the host (load a module, make a handle, connect NCCL) happens here, not behind a
        hold. run() calls it (a step: with a lap that times nothing)."""
        if fn in self._warmed:
            return
        (run or fn)()
        self.torch.cuda.synchronize()
        self._warmed.add(fn)

    def _device_op_s(self, op) -> float:
        """One operation's device time, from one held batch of 10, to size batches and graph
        replays. Asked once per prepared op; every rank takes the slowest rank's figure, so
        all run the same counts. A hold that ran out marks the op (time_ops then times it
        unheld)."""
        if self._batch_for is not op:
            r = time_held(op, 1, 10, self._holds(), self._event, self.torch.cuda.synchronize, meet=self._meet)
            est, ran_out = float(r.samples_s[0]), float(self._uncovered(r.held.all()))
            if self.size > 1:
                est, ran_out = self.max_over_ranks(np.array([est, ran_out]))
            if ran_out:
                self._expired.add(op)
            self._batch_for, self._op_s = op, est
        return self._op_s

    def _holds(self):
        if self._hold_factory is None:
            # COMMBENCH_NO_HOLD=1: events on an idle stream, as before holds (a diagnostic:
            # it shows what the host's launch cost does to the samples; rows say unheld).
            if os.environ.get(NO_HOLD_ENV) == "1":
                self._hold_factory, self._hold_method = NoHold, "none"
            else:
                self._hold_factory, self._hold_method, self._hold_fallback = make_holds(self.torch)
        return self._hold_factory

    def _meet(self):
        """The ranks' host-side barrier before a release: over gloo, which does not touch the
        held CUDA stream (an NCCL barrier would queue behind the hold)."""
        if self.size > 1:
            self.dist.barrier(group=self.host_group)

    def time_steps(self, step, iters, nlaps, barrier_each=False, hold=False, host_waits=()):
        """CPU: the host clock (Comm.time_steps). CUDA: the laps as events on the current
        stream; hold: the stream held while the host enqueues each step and the ranks meet,
        released before the stages in host_waits (indices of stages that wait for the
        device on the host) and put up again after them. A held step runs once unheld first;
        a step whose hold ran out once is timed unheld for the rest of the point. Rows get
        the same coverage fields as held ops (self.last_timing)."""
        if self.device != "cuda":
            return super().time_steps(step, iters, nlaps, barrier_each)
        between = functools.partial(self.dist.barrier, group=self.group) if barrier_each else None
        sync = self.torch.cuda.synchronize
        if not hold:
            self.last_timing = {"clock": "cuda_event"}
            self._mark_shared()
            return time_steps_with_events(step, iters, nlaps, self._event, sync, between=between)
        holds = self._holds()
        self._first_unheld(step, lambda: step(lambda: None))
        expired = step in self._expired
        info: dict = {}
        out = time_steps_with_events(step, iters, nlaps, self._event, sync, between=between,
                                     hold=NoHold if expired else holds, meet=self._meet,
                                     host_waits=host_waits, info=info)
        if not expired and self._ran_out(self._uncovered(info["held"])):
            self._expired.add(step)
        self.last_timing = {"ops_per_sample": 1, **info, **self._hold_fields(),
                            "sample": "one step between events, stream held while it is enqueued",
                            "clock": "cuda_event_held" if self._hold_method != "none" else "cuda_event"}
        if expired:
            self.last_timing.update(sample="one step between events on an idle stream", clock="cuda_event",
                                    unheld_reason=self._expired_why())
        self._mark_shared()
        return out

    # --- CUDA graph plumbing (torch.cuda) -------------------------------------------
    def _event(self):
        return self.torch.cuda.Event(enable_timing=True)

    @contextlib.contextmanager
    def _side_stream(self):
        """Warm-up before capture runs on a side stream, as torch.cuda.graph asks; the
        current stream then waits for it."""
        torch = self.torch
        if self._warm_stream is None:
            self._warm_stream = torch.cuda.Stream()
        s = self._warm_stream
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            yield
        torch.cuda.current_stream().wait_stream(s)

    def _capture(self, body):
        """One graph of body()'s collectives. torch.cuda.graph captures on its own
        non-default stream; ProcessGroupNCCL joins its NCCL stream to the capture (NCCL >=
        2.9.6). thread_local: the NCCL watchdog thread's event queries must not break it."""
        torch = self.torch
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            body()
        return graph

    @staticmethod
    def _replay(graph):
        graph.replay()


HOLD_CAP_HINT = "COMMBENCH_HOLD_CAP_S sets it"
NO_HOLD_ENV = "COMMBENCH_NO_HOLD"


class _IdentitySet:
    """Objects by identity, held weakly where they allow it (functions and partials do), so
    an id is never reused for a later point's op."""

    def __init__(self):
        self._weak: weakref.WeakSet = weakref.WeakSet()
        self._strong: dict = {}

    def add(self, obj) -> None:
        try:
            self._weak.add(obj)
        except TypeError:
            self._strong[id(obj)] = obj

    def __contains__(self, obj) -> bool:
        try:
            return obj in self._weak
        except TypeError:
            return id(obj) in self._strong
