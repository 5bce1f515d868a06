"""JAX backend: the collectives as jax.lax primitives inside shard_map, compiled by XLA.

One process per rank, one device per process (a CPU device with gloo collectives here, the
local rank's GPU with NCCL on a GPU host), joined by jax.distributed.initialize. A JAX user
pays for a collective differently from an eager torch or MPI call: the operation is a
compiled program, so there is no per-call Python cost inside it, but each program call
costs a dispatch. A sample is therefore k operations inside ONE compiled program (a
fori_loop whose trip count is a runtime argument, so one compile serves the check's single
operation and the timed loops), block_until_ready at the end, divided by k, as graph
replays are on nccl. The compile is timed once per point and reported beside the samples
(`compile_ms`), never inside them.

Buffers are host numpy arrays (page-aligned, as on mpi) that benchmarks fill and check as
on every other backend; a prepared operation moves its input to the device when it runs,
and the single-operation call (the check) writes the device result back into the receive
buffer. The timed loops move the input once, before the samples.

Host-side agreement (object gathers, the max over ranks of the samples, the barrier of the
ranks a sub-world leaves out) goes through the key-value store of jax.distributed's
coordination service, which blocks without spinning and needs no compile.
"""
from __future__ import annotations

import math
import os
import pickle
import time

import numpy as np

from commbench.backends.jax_probe import cuda_plugin
from commbench.backends.mpi import aligned_empty
from commbench.backends.rendezvous import meet, parse_port, prepare_rendezvous, prepare_torch_env
from commbench.core.errors import UsageError

from .base import Comm, Handle

AXIS = "ranks"  # the mesh axis every collective names

# Ops per sample: enough that a sample lasts about SAMPLE_TARGET_S, so the program call's
# fixed cost (dispatch, the loop's entry copy of the input, the result's allocation: ~0.3 ms
# on the 2-core loopback, against ~0.1 ms for one 8 B psum over gloo) is a few per cent of
# it; at most MAX_OPS_PER_SAMPLE. An operation longer than the target runs alone.
SAMPLE_TARGET_S = 0.01
MAX_OPS_PER_SAMPLE = 200
PROBE_OPS = 8  # the program length one operation's time is estimated from
# A caller asking for many samples outside the harness's calibration (the loopback probe's
# 2,000 latency samples) gets fewer operations per sample, so that its whole loop runs at
# most this many operations (the harness's loops stay far below it: ~10 ms samples for at
# most a few hundred ms).
MAX_OPS_PER_CALL = 4000

# How long one blocking read of the key-value store waits before it is asked again (the
# guard thread ends a rank that waits too long; this only bounds one gRPC call).
KV_WAIT_MS = 10 * 60 * 1000

_NP_DTYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "float64": np.float64,
              "uint8": np.uint8}


def np_dtype(name: str):
    if name == "bfloat16":  # numpy has none; ml_dtypes (a jax dependency) gives JAX's own
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    if name not in _NP_DTYPES:
        raise UsageError(f"dtype {name} is not supported by backend jax")
    return np.dtype(_NP_DTYPES[name])


class KeyValueGroups:
    """Gathers over any set of ranks through the coordination service's key-value store.
    Every member of a set makes the same sequence of calls over that set, so a counter per
    set names each call's keys; a rank finishing call s deletes its key of call s-1, which
    every member has read by then (each wrote its key of s only after reading all of s-1)."""

    def __init__(self, client, namespace: str, rank: int):
        self.client, self.ns, self.rank = client, namespace, rank
        self._seq: dict[tuple, int] = {}

    def _key(self, ranks: tuple, seq: int, rank: int) -> str:
        return f"commbench/{self.ns}/{'-'.join(map(str, ranks))}/{seq}/{rank}"

    def _get(self, key: str) -> bytes:
        while True:
            try:
                return self.client.blocking_key_value_get_bytes(key, KV_WAIT_MS)
            except Exception as e:  # noqa: BLE001 (jaxlib raises its own runtime error type)
                if "DEADLINE_EXCEEDED" not in str(e):
                    raise

    def allgather(self, obj, ranks: tuple) -> list:
        seq = self._seq.get(ranks, 0)
        self._seq[ranks] = seq + 1
        self.client.key_value_set_bytes(self._key(ranks, seq, self.rank), pickle.dumps(obj))
        out = [pickle.loads(self._get(self._key(ranks, seq, r))) for r in ranks]
        if seq:
            self.client.key_value_delete(self._key(ranks, seq - 1, self.rank))
        return out


class JaxOp:
    """A prepared collective: `body`, a per-device function of jax.lax collectives over
    AXIS, in shard_map over the mesh of `ranks`, compiled once into a program that runs it
    k times (k a runtime argument). Calling it runs one operation on the current contents
    of `src` and writes this rank's result into `recv`; JaxComm.time_ops runs samples.

    XLA hoists a loop-invariant collective out of a loop (an optimization_barrier did not
    stop it), so each iteration's input is tied to the previous output: element 0 of the
    input is replaced by select(k < 0, out[0], in[0]), a runtime condition XLA cannot fold,
    which always keeps in[0]. That is one element written in place per operation. The
    input is donated to the program, which returns it unchanged beside the result, so the
    loop works in the input's own buffer (without donation XLA copies the input into the
    loop at every call: at 4 MiB, a memcpy inside every one-operation sample) and the next
    sample takes the returned input."""

    def __init__(self, comm: "JaxComm", lax_op: str, body, src: np.ndarray, recv: np.ndarray | None,
                 ranks: tuple | None = None):
        self.comm, self.lax_op, self.body, self.src, self.recv = comm, lax_op, body, src, recv
        self.ranks = ranks or comm.ranks
        self.compiled = None
        self.compile_s = float("nan")
        self.ops_per_sample: int | None = None
        self.call_fixed_s = float("nan")

    # --- device side -------------------------------------------------------------------
    def device_input(self):
        jax = self.comm.jax
        mesh = self.comm.mesh(self.ranks)
        local = jax.device_put(np.ascontiguousarray(self.src), self.comm.local_device)
        shape = (len(self.ranks) * self.src.shape[0],) + self.src.shape[1:]
        return jax.make_array_from_single_device_arrays(shape, self.comm.sharding(mesh), [local])

    def compile(self, x) -> None:
        """Lower and compile the k-operation program once; the time is the point's compile time."""
        jax = self.comm.jax
        lax, jnp = jax.lax, jax.numpy
        body = self.body

        def loop(x, k):
            never = k < 0

            def step(_, carry):
                xs, _ = carry
                out = body(xs)
                tie = jnp.where(never, out[:1].astype(xs.dtype), xs[:1])
                return lax.dynamic_update_slice(xs, tie, (0,)), out
            # zeros_like(body(x)) gives the carry the output's type (varying or not over
            # AXIS); the unused collective inside it is removed by XLA.
            return lax.fori_loop(0, k, step, (x, jnp.zeros_like(body(x))))
        P = jax.sharding.PartitionSpec
        fn = jax.jit(jax.shard_map(loop, mesh=self.comm.mesh(self.ranks), in_specs=(P(AXIS), P()),
                                   out_specs=(P(AXIS), P(AXIS))), donate_argnums=0)
        t0 = time.perf_counter()
        self.compiled = fn.lower(x, np.int32(1)).compile()
        self.compile_s = time.perf_counter() - t0

    def run(self, x, k):
        """k operations on x (donated): returns (x, result), both ready."""
        return self.comm.jax.block_until_ready(self.compiled(x, np.int32(k)))

    def __call__(self) -> None:
        x = self.device_input()
        if self.compiled is None:
            self.compile(x)
        _, out = self.run(x, 1)
        if self.recv is not None:
            self.recv[...] = np.asarray(out.addressable_shards[0].data).reshape(self.recv.shape)

    # --- timing ------------------------------------------------------------------------
    def choose_ops_per_sample(self, x) -> tuple[int, object]:
        """k from a program of PROBE_OPS operations (best of three calls): the operation's
        time with the call's cost spread over them, an over-estimate, so k errs low. A
        program of one operation beside it gives the call's fixed cost, for the rows. Each
        decision is taken on figures the op's ranks agreed on (the slowest rank's), so every
        rank makes the same program calls and runs the same k. Returns k and the input
        (each call consumes the one it is given and returns it)."""
        clock = time.perf_counter

        def best(k):
            nonlocal x
            ts = []
            for _ in range(3):
                t0 = clock()
                x, _ = self.run(x, k)
                ts.append(clock() - t0)
            return min(ts)

        def agreed(value):
            return max(self.comm.kv.allgather(float(value), self.ranks))
        t1 = agreed(best(1))
        if t1 >= SAMPLE_TARGET_S:
            return 1, x
        tk = agreed(best(PROBE_OPS))
        fixed = t1 - (tk - t1) / (PROBE_OPS - 1)
        self.call_fixed_s = fixed if fixed > 0 else float("nan")  # noise can hide it: then unknown
        return int(max(1, min(MAX_OPS_PER_SAMPLE, math.ceil(SAMPLE_TARGET_S / max(tk / PROBE_OPS, 1e-9))))), x

    def samples(self, iters: int, barrier_each: bool) -> np.ndarray:
        """Seconds per operation: each sample one program call of k operations, host clock
        around the call and block_until_ready, divided by k. barrier_each (OSU's method):
        one operation per program call and a barrier after it, outside the timed window."""
        x = self.device_input()
        if self.compiled is None:
            self.compile(x)
            x, _ = self.run(x, 1)  # first call: the collectives' communicators form
        if barrier_each:
            k = 1
        else:
            if self.ops_per_sample is None:
                self.ops_per_sample, x = self.choose_ops_per_sample(x)
            # The same cap on every rank (iters is agreed), so the counts still match.
            k = max(1, min(self.ops_per_sample, MAX_OPS_PER_CALL // max(1, int(iters))))
        barrier = self.comm.barrier_op() if barrier_each else None
        times = np.empty(int(iters), dtype=np.float64)
        clock, run, ready = time.perf_counter, self.compiled, self.comm.jax.block_until_ready
        karr = np.int32(k)
        for i in range(times.size):
            t0 = clock()
            x, _ = ready(run(x, karr))
            times[i] = clock() - t0
            if barrier is not None:
                barrier()
        times /= k
        fixed_us = None if self.call_fixed_s != self.call_fixed_s else self.call_fixed_s * 1e6
        self.comm.last_timing = {
            "clock": "jax_compiled_loop", "ops_per_sample": k, "compile_ms": self.compile_s * 1e3,
            "jax_op": self.lax_op, "program_call_fixed_us": fixed_us,
            "sample": (f"mean of the {k} operations of one compiled fori_loop program (block_until_ready); "
                       f"percentiles over programs" if k > 1 else
                       "one operation per compiled program call (block_until_ready)")}
        return times


class JaxComm(Comm):
    backend = "jax"
    timing_method = "host_clock"  # multi-stage steps (moe) read the host clock around blocked stages

    def __init__(self, owner: "JaxBackend", ranks: tuple, namespace: str):
        import jax

        super().__init__(owner.rank, len(ranks))
        self.jax, self.owner, self.ranks = jax, owner, ranks
        self.device = owner.device
        self.local_device = owner.local_device
        self.kv = KeyValueGroups(owner.client, namespace, owner.rank)
        self.last_timing: dict = {}
        self._barrier = None
        self._meshes: dict = {}

    # --- meshes ------------------------------------------------------------------------
    def mesh(self, ranks: tuple):
        if ranks not in self._meshes:
            devs = [self.owner.device_of[r] for r in ranks]
            self._meshes[ranks] = self.jax.sharding.Mesh(np.array(devs), (AXIS,))
        return self._meshes[ranks]

    def sharding(self, mesh):
        return self.jax.sharding.NamedSharding(mesh, self.jax.sharding.PartitionSpec(AXIS))

    # --- memory ------------------------------------------------------------------------
    def alloc(self, count, dtype):
        return aligned_empty(count, np_dtype(dtype))

    def fill(self, buf, values):
        buf[...] = np.asarray(values, dtype=np.float64).astype(buf.dtype)

    def to_numpy(self, buf):
        return np.asarray(buf).astype(np.float64)

    def host_view(self, buf):
        return buf

    # --- prepared operations -----------------------------------------------------------
    def out_of_place_all_reduce(self, dtype: str) -> bool:
        return True  # XLA writes a result buffer of its own; in place means reading recv

    def all_reduce(self, send, recv, in_place=False):
        lax = self.jax.lax
        return JaxOp(self, "psum", lambda x: lax.psum(x, AXIS), recv if in_place else send, recv)

    def reduce_scatter(self, send, recv):
        lax = self.jax.lax
        return JaxOp(self, "psum_scatter", lambda x: lax.psum_scatter(x, AXIS, scatter_dimension=0, tiled=True),
                     send, recv)

    def all_gather(self, send, recv):
        lax = self.jax.lax
        return JaxOp(self, "all_gather", lambda x: lax.all_gather(x, AXIS, tiled=True), send, recv)

    def all_to_all(self, send, recv, send_counts=None, recv_counts=None):
        if send_counts is not None or recv_counts is not None:
            raise UsageError("backend jax: an all_to_all with split sizes is jax.lax.ragged_all_to_all, which only "
                             "the moe benchmark's jax engine drives")
        lax = self.jax.lax
        return JaxOp(self, "all_to_all", lambda x: lax.all_to_all(x, AXIS, 0, 0, tiled=True), send, recv)

    def broadcast(self, buf, root):
        """jax.lax has no broadcast: the root's data plus zeros elsewhere, summed (what
        jax.experimental.multihost_utils.broadcast_one_to_all does), so a JAX broadcast
        costs an all_reduce of S and rows say psum_masked."""
        lax, jnp = self.jax.lax, self.jax.numpy

        def body(x):
            return lax.psum(jnp.where(lax.axis_index(AXIS) == root, x, jnp.zeros_like(x)), AXIS)
        return JaxOp(self, "psum_masked", body, buf, buf)

    def send_recv(self, send, recv, peer):
        """ppermute over a mesh of this rank and its peer alone, so a pair exchanges without
        the other ranks (the loopback probe times ranks 0 and 1 while the rest wait)."""
        if not 0 <= peer < self.size or peer == self.rank:
            raise UsageError(f"send_recv: peer {peer} is not another rank of a world of {self.size}")
        lax = self.jax.lax
        pair = tuple(sorted((self.ranks[self.rank], self.ranks[peer])))
        return JaxOp(self, "ppermute", lambda x: lax.ppermute(x, AXIS, [(0, 1), (1, 0)]), send, recv, ranks=pair)

    def barrier_op(self):
        """A psum of one int32: the ranks meet in a collective of the same library."""
        if self._barrier is None:
            self._barrier = JaxOp(self, "psum", lambda x: self.jax.lax.psum(x, AXIS), np.ones(1, np.int32), None)
        return self._barrier

    def iall_reduce(self, send, recv) -> Handle:
        raise UsageError("backend jax has no non-blocking collectives to overlap by hand: XLA schedules a "
                         "program's collectives itself")

    def rows_all_to_all(self, *args, **kwargs):
        raise UsageError("backend jax moves MoE rows with its own engine (jax.lax.ragged_all_to_all)")

    # --- control -----------------------------------------------------------------------
    def barrier(self) -> None:
        self.barrier_op()()

    def idle_barrier(self) -> None:
        self.kv.allgather(None, self.ranks)

    def max_over_ranks(self, values):
        values = np.asarray(values, dtype=np.float64)
        return np.max(np.stack(self.kv.allgather(values, self.ranks)), axis=0)

    def allgather_obj(self, obj):
        return self.kv.allgather(obj, self.ranks)

    def time_ops(self, op, iters, barrier_each=False, per_op_events=False):
        """A JaxOp: compiled-loop samples (JaxOp.samples). Anything else (an op a plug-in
        wrapped in Python): the host clock around each call (Comm.time_ops)."""
        if isinstance(op, JaxOp):
            return op.samples(iters, barrier_each)
        return super().time_ops(op, iters, barrier_each)


# The start-up wait when no run's --timeout is given (the suite's default timeout_s).
RENDEZVOUS_DEFAULT_S = 300.0


class JaxBackend:
    def __init__(self, name: str, device: str | None):
        self.name = name
        self.device = device or "cpu"
        if self.device not in ("cpu", "cuda"):
            raise UsageError(f"backend jax: unknown device {self.device!r} (cpu or cuda)")
        if self.device == "cuda" and cuda_plugin() is None:
            raise UsageError("backend jax with device cuda needs JAX's CUDA plugin (pip install 'jax[cuda12]')")
        self._comms = 0
        # How long start-up may wait for the other ranks (the run's --timeout; runner.start).
        self.rendezvous_s = RENDEZVOUS_DEFAULT_S

    @staticmethod
    def coordinator(info) -> str:
        """Rank 0's host and a port, agreed as the torch backends agree on theirs (MASTER_ADDR /
        MASTER_PORT, filled over MPI under mpirun/srun). COMMBENCH_JAX_COORDINATOR=host:port
        overrides it. Under torchrun the agent's own store listens on MASTER_PORT, so the
        coordinator takes the next port."""
        given = os.environ.get("COMMBENCH_JAX_COORDINATOR")
        if given is not None:
            host, sep, port_text = given.strip().rpartition(":")
            if not sep or not host.strip("[]") or any(c.isspace() for c in host):
                raise UsageError(f"COMMBENCH_JAX_COORDINATOR must be host:port, got {given!r}")
            return f"{host}:{parse_port(port_text, 'the port of COMMBENCH_JAX_COORDINATOR')}"

        prepare_torch_env(info)
        for key in ("MASTER_ADDR", "MASTER_PORT"):
            if key not in os.environ:
                raise UsageError(f"backend jax needs {key} for its coordinator (torchrun sets it; commbench run --np "
                                 f"sets it), or COMMBENCH_JAX_COORDINATOR=host:port")
        port = parse_port(os.environ["MASTER_PORT"], "MASTER_PORT") + (1 if os.environ.get("TORCHELASTIC_RUN_ID")
                                                                        else 0)
        if info.world > 1:  # the torch backends' check: an address a rank cannot reach is one line, at once
            prepare_rendezvous(os.environ["MASTER_ADDR"], str(port))
        return f"{os.environ['MASTER_ADDR']}:{port}"

    def init(self, info) -> JaxComm:
        import jax

        jax.config.update("jax_platforms", "cpu" if self.device == "cpu" else "cuda")
        if self.device == "cpu":
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
            local = [0]
        else:
            from .gpus import visible_gpus

            local = [info.local_rank % max(1, visible_gpus())]
        coordinator = self.coordinator(info)
        # JAX aborts the process (a C++ fatal check, after its own 300 s) when a task never
        # registers: the ranks first meet where the coordinator will listen, within the run's
        # --timeout, and only a launch that is all there starts JAX.
        host, _, port = coordinator.rpartition(":")
        what = ("COMMBENCH_JAX_COORDINATOR" if os.environ.get("COMMBENCH_JAX_COORDINATOR") is not None
                else "the jax coordinator (MASTER_ADDR:MASTER_PORT)")
        meet(host.strip("[]"), int(port), info.rank, info.world, self.rendezvous_s, what)
        jax.distributed.initialize(coordinator, num_processes=info.world, process_id=info.rank,
                                   local_device_ids=local, initialization_timeout=max(10, int(self.rendezvous_s)))
        from jax._src.distributed import global_state

        self.client = global_state.client
        self.rank = info.rank
        self.local_device = jax.local_devices()[0]
        by_process = {d.process_index: d for d in jax.devices()}
        if len(by_process) != info.world or len(jax.devices()) != info.world:
            raise UsageError(f"backend jax: expected one device per process, got {len(jax.devices())} devices over "
                             f"{len(by_process)} processes")
        self.device_of = [by_process[r] for r in range(info.world)]
        self.world = self._comm(tuple(range(info.world)))
        return self.world

    def _comm(self, ranks: tuple) -> JaxComm:
        self._comms += 1
        return JaxComm(self, ranks, f"c{self._comms}")

    def split(self, n: int) -> JaxComm | None:
        """The first n ranks: a mesh over their devices; the others get None. Every rank
        calls it, so the communicator counters (key namespaces) agree."""
        if n == self.world.size:
            return self.world
        comm = self._comm(tuple(range(n)))
        return comm if self.rank < n else None

    def versions(self) -> dict:
        import jax
        import jaxlib

        out = {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
               "jax_collectives": "gloo" if self.device == "cpu" else "nccl"}
        return out

    def gpu_names(self) -> list[str]:
        if self.device != "cuda":
            return []
        return [self.local_device.device_kind]

    def finalize(self) -> None:
        import jax

        jax.distributed.shutdown()
