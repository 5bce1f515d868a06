"""The compute that the overlap benchmark hides communication behind: a float32 matrix
multiply in row blocks (numpy, or torch on CPU or CUDA) whose result checks exactly, the
BLAS thread limit, and the calibration that sizes it to a target time.

No clock lives here: the benchmark times computes through its communicator's sampling
loop (Comm.time_steps), so host and device timing are decided in one place.
"""
from __future__ import annotations

import ctypes
import functools
import re
from typing import Callable

import numpy as np

from commbench.backends.base import Comm
from commbench.core.errors import UsageError

CALIBRATE_TOL = 0.10           # calibrated compute within 10 % of t_comm
CALIBRATE_ROUNDS = 8


def gemm_flops(n: int) -> float:
    """2 M N K for M = N = K = n."""
    return 2.0 * float(n) ** 3


# --- the matrix multiply --------------------------------------------------------------------------

def _gemm_inputs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """A, B with entries in {-1, 0, 1}: every entry of A @ B is an integer of magnitude
    <= n, exact in float32 whatever the summation order, so the result checks exactly.
    Built in int8 (a 16384^2 int64 temporary would be 2 GiB)."""
    i = np.arange(n, dtype=np.int64)
    r3, c3 = (i % 3).astype(np.int8), ((2 * i) % 3).astype(np.int8)
    a = ((r3[:, None] + c3[None, :]) % 3 - 1).astype(np.float32)       # (i + 2j) % 3 - 1
    b = ((c3[:, None] + r3[None, :] + 1) % 3 - 1).astype(np.float32)   # (2i + j + 1) % 3 - 1
    return a, b


def _row_bounds(n: int, nchunks: int) -> list[tuple[int, int]]:
    edges = [(k * n) // nchunks for k in range(nchunks + 1)]
    return list(zip(edges[:-1], edges[1:]))


class Compute:
    """What the overlap core needs of a compute: `chunks` (callables, run in order, together
    the whole compute), `flops`, sync() (wait for the device; no-op on CPU)."""

    name = "cpu"
    chunks: list = []
    flops: float = 0.0
    n: int = 0

    def run(self) -> None:
        for c in self.chunks:
            c()

    def sync(self) -> None:
        pass

    def reset(self) -> None:
        """Poison the result so a chunk that did not run shows in check()."""

    def check(self) -> bool:
        return True


class Gemm(Compute):
    """C = A @ B (float32, M = N = K = n) in row blocks: chunk k computes C[lo:hi] = A[lo:hi] @ B.

    lib: "numpy" (CPU), "torch" (CPU or CUDA, by `device`)."""

    def __init__(self, n: int, nchunks: int, lib: str, device: str = "cpu"):
        if nchunks > n:
            raise UsageError(f"overlap: gemm {n} has fewer rows than the {nchunks} compute chunks")
        self.n, self.lib, self.device = n, lib, device
        self.flops = gemm_flops(n)
        self.bounds = _row_bounds(n, nchunks)
        a, b = _gemm_inputs(n)
        if lib == "numpy":
            self.name = "numpy"
            self.a, self.b, self.c = a, b, np.full((n, n), np.nan, np.float32)
            mm = np.matmul
            self.chunks = [functools.partial(mm, a[lo:hi], b, out=self.c[lo:hi]) for lo, hi in self.bounds]
        else:
            import torch

            self.torch = torch
            dev = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
            self.name = "torch-cuda" if device == "cuda" else "torch-cpu"
            self.a = torch.from_numpy(a).to(dev)
            self.b = torch.from_numpy(b).to(dev)
            self.c = torch.full((n, n), float("nan"), dtype=torch.float32, device=dev)
            mm = torch.mm
            self.chunks = [functools.partial(mm, self.a[lo:hi], self.b, out=self.c[lo:hi]) for lo, hi in self.bounds]

    def sync(self):
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def reset(self):
        if self.lib == "numpy":
            self.c[...] = np.nan
        else:
            self.c.fill_(float("nan"))

    def result(self) -> np.ndarray:
        if self.lib == "numpy":
            return self.c
        return self.c.cpu().numpy()

    def check(self) -> bool:
        """Finite everywhere (an uncomputed chunk stays NaN), and exact on the first and
        last row of every chunk against a float64 reference."""
        self.sync()
        c = self.result()
        if not np.isfinite(c).all():
            return False
        rows = sorted({r for lo, hi in self.bounds for r in (lo, hi - 1)})
        if self.lib == "numpy":
            ref = self.a[rows].astype(np.float64) @ self.b.astype(np.float64)
        else:  # on the compute's device, in float64
            ref = (self.a[rows].double() @ self.b.double()).cpu().numpy()
        return bool(np.array_equal(c[rows].astype(np.float64), ref))


# --- BLAS / intra-op threads --------------------------------------------------------------

def _openblas():
    """The OpenBLAS numpy loaded (numpy's wheels bundle scipy-openblas), found the way
    threadpoolctl finds it (the process's mapped libraries), as (get, set) or None."""
    try:
        maps = open("/proc/self/maps").read()
    except OSError:
        return None
    for path in sorted(set(re.findall(r"(/\S*openblas\S*\.so\S*)", maps))):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas", "64_"), ("scipy_openblas", ""), ("openblas", "64_"), ("openblas", "")):
            get = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
            put = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
            if get is not None and put is not None:
                return get, put
    return None


def set_compute_threads(compute_name: str, threads: int) -> tuple[Callable[[], None], str]:
    """Limit the compute's threads (two ranks on two cores with multi-threaded BLAS would
    fight over the cores and over the MPI progress); returns (restore, how)."""
    if compute_name == "numpy":
        ob = _openblas()
        if ob is None:
            return (lambda: None), "not set (no OpenBLAS found: set OPENBLAS_NUM_THREADS/OMP_NUM_THREADS)"
        get, put = ob
        before = int(get())
        put(int(threads))
        return (lambda: put(before)), "openblas_set_num_threads"
    if compute_name == "torch-cpu":
        import torch

        before = torch.get_num_threads()
        torch.set_num_threads(int(threads))
        return (lambda: torch.set_num_threads(before)), "torch.set_num_threads"
    return (lambda: None), "n/a" if compute_name != "torch-cuda" else "n/a (GPU)"


# --- calibration ------------------------------------------------------------------------

def host_runs(comp: Compute, n: int) -> np.ndarray:
    """Seconds of n runs of a compute by the host clock (what calibrate_gemm uses when the
    caller has no communicator to time with)."""

    return Comm(0, 1).time_steps(lambda lap: comp.run(), n, 0)[0]


def calibrate_gemm(target_s: float, make: Callable[[int], Compute], agree: Callable[[float], float],
                   lo: int, hi: int, n0: int = 64, tol: float = CALIBRATE_TOL,
                   rounds: int = CALIBRATE_ROUNDS,
                   time_runs: Callable[[Compute, int], np.ndarray] = host_runs) -> Compute:
    """The compute whose time is about target_s (OSU: compute ~ the pure collective's time):
    n scaled by the cube root of the time ratio until within tol. agree(t) returns the
    slowest rank's time, so every rank takes the same steps and ends with the same n.
    time_runs(compute, k) -> k run times in seconds (the communicator's clock). How many
    runs follow the first three is decided from their times: a time_runs that synchronizes
    the ranks (a barrier between runs) must return the same times on every rank (the
    slowest rank's per run), or the ranks would run different counts and hang.

    Each size is timed for about 50 ms: a short window. A caller that then times the chosen
    compute in a longer loop should check it against the target (the overlap benchmark
    recalibrates from that loop when it misses by more than CALIBRATION_WARN_FACTOR)."""
    n = int(min(max(n0, lo), hi))
    best = None
    for _ in range(rounds):
        comp = make(n)
        comp.run()  # one untimed run: first-touch, BLAS buffers
        ts = time_runs(comp, 3)
        # Up to 50 runs or about 50 ms, whichever comes first.
        more = int(min(47, 0.05 / max(float(np.median(ts)), 1e-6))) - 3
        if more > 0:
            ts = np.concatenate([ts, time_runs(comp, more)])
        t = agree(float(np.median(ts)))
        err = abs(t - target_s) / target_s if target_s > 0 else 0.0
        if best is None or err < best[0]:
            best = (err, comp, n)
        if err <= tol or target_s <= 0:
            break
        nxt = int(round(n * (target_s / t) ** (1 / 3))) if t > 0 else n * 2
        nxt = int(min(max(nxt, lo), hi))
        if nxt == n:
            break
        n = nxt
    return best[1]
