"""The GPU's memory ceiling, measured: device-to-device copy bandwidth (the HBM probe)."""
from __future__ import annotations

import numpy as np

from .timing import time_with_events


def hbm_copy_gbps(nbytes: int = 1 << 30, iters: int = 20) -> float:
    """Device-to-device copy rate on the current CUDA device, in GB/s of bytes COPIED per
    second (1e9 B/s), best of `iters` copies of `nbytes`, each timed with CUDA events.
    Every copied byte is read once and written once, so the HBM traffic is twice this:
    compare 2x this figure with a profile's HBM bandwidth (a read + write total, e.g.
    h200-hgx's 4.8 TB/s). Raises RuntimeError without CUDA."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError("hbm_copy_gbps needs a CUDA device (torch.cuda.is_available() is False)")
    n = max(int(nbytes), 1 << 20)
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    src.fill_(1)
    dst.copy_(src)  # first touch and warm-up outside the timing
    torch.cuda.synchronize()
    times = time_with_events(lambda: dst.copy_(src), max(int(iters), 1),
                             lambda: torch.cuda.Event(enable_timing=True), torch.cuda.synchronize)
    return float(n / np.min(times) / 1e9)


# --- what blocks the host behind a held stream (gpu_check's probe step) -------------------
#
# A call that waits for the device on the host (a synchronizing copy, an allocator that
# frees, a first launch that loads a module, NCCL's barrier) stalls behind a hold until the
# hold ends: held timing must never enqueue one. The probe puts a fixed spin of PROBE_HOLD_S
# on the stream, times each call on the host, then drains: a call that blocks takes about
# what is left of the spin; one that does not, its launch cost.
PROBE_HOLD_S = 0.05
# A call is said to block when it took more than this share of the spin (a launch costs us).
BLOCKS_FRACTION = 0.5


def blocks_host(action, hold, sync, hold_s: float = PROBE_HOLD_S, clock=None) -> float:
    """Host seconds action() took while the stream was held by hold(hold_s); the device is
    drained after it, so the next call starts on an idle stream."""
    import time

    clock = clock or time.perf_counter
    hold(hold_s)
    t0 = clock()
    action()
    took = clock() - t0
    sync()
    return took


def probe(actions, hold, sync, hold_s: float = PROBE_HOLD_S, clock=None) -> list[dict]:
    """[{name, host_ms, blocks}] for each (name, action, warm): warm actions run once unheld
    first (their first-launch cost is not what they are probed for); a failing action is
    reported with its error, not raised."""
    out = []
    for name, action, warm in actions:
        try:
            if warm:
                action()
                sync()
            took = blocks_host(action, hold, sync, hold_s, clock)
            out.append({"name": name, "host_ms": took * 1e3, "blocks": took > BLOCKS_FRACTION * hold_s})
        except Exception as e:  # noqa: BLE001 (one line per action, whatever went wrong)
            sync()
            out.append({"name": name, "error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:100]}"
                        if str(e).strip() else type(e).__name__})
    return out


def probe_lines(rows: list[dict], hold_s: float = PROBE_HOLD_S) -> list[str]:
    """One line per probed call: host time behind a hold of hold_s, and whether it blocked."""
    lines = []
    for r in rows:
        if "error" in r:
            lines.append(f"{r['name']}: failed ({r['error']})")
        else:
            verdict = "BLOCKS the host until the hold ends" if r["blocks"] else "does not block"
            lines.append(f"{r['name']}: {r['host_ms']:.2f} ms behind a {hold_s * 1e3:.0f} ms hold: {verdict}")
    return lines


def gpu_actions(torch, dist) -> list[tuple]:
    """The calls the GPU path makes or might make behind a hold, on the current CUDA device
    (a world-1 NCCL group initialised): (name, action, warm first)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    small = torch.arange(4096, device=dev)
    idx = (small * 7919) % 4096
    rows = torch.randn(4096, 64, device=dev)
    out = torch.zeros_like(rows)
    counts = torch.full((64,), 64, device=dev, dtype=torch.int64)
    pinned = torch.ones(1 << 20, pin_memory=True)
    pageable = torch.ones(1 << 20)
    dst = torch.empty(1 << 20, device=dev)

    def malloc():
        # Larger than any block the caching allocator holds yet: it calls cudaMalloc. (Not
        # empty_cache() first: its cudaFree synchronizes the device, which is not the malloc.)
        torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    return [
        ("nccl barrier", lambda: dist.barrier(), True),
        ("first launch of a kernel (lazy module load)", lambda: torch.special.i0e(rows), False),
        ("cudaMalloc (caching allocator, new block)", malloc, False),
        # 2 MiB: pinning takes host time by the page, and a large block's would read as a stall
        ("cudaHostAlloc (pinned host tensor)", lambda: torch.empty(2 << 20, dtype=torch.uint8, pin_memory=True),
         False),
        ("host-to-device copy, pageable", lambda: dst.copy_(pageable), True),
        ("host-to-device copy, pinned, non_blocking", lambda: dst.copy_(pinned, non_blocking=True), True),
        ("moe: torch.sort(stable)", lambda: torch.sort(idx, stable=True), True),
        ("moe: scatter_add_ (counts)", lambda: torch.zeros(4096, dtype=torch.int64, device=dev).scatter_add_(
            0, idx, torch.ones_like(idx)), True),
        ("moe: cumsum", lambda: torch.cumsum(counts, 0), True),
        ("moe: repeat_interleave(output_size)", lambda: torch.repeat_interleave(small[:64], counts,
                                                                                output_size=4096), True),
        ("moe: index_select (pack)", lambda: torch.index_select(rows, 0, idx), True),
        ("moe: index_add_ (combine)", lambda: out.index_add_(0, idx, rows), True),
        ("moe: .tolist() of split sizes (the sync stage)", lambda: counts.tolist(), True),
    ]


def run_probe(hold_s: float = PROBE_HOLD_S) -> list[dict]:
    """The probe on this machine's first GPU: a world-1 NCCL group (MASTER_ADDR/PORT from
    the environment, loopback defaults), torch.cuda._sleep as the hold (no cupy needed)."""
    import torch
    import torch.distributed as dist

    from .gpuhold import clock_hz

    _world1_nccl(torch, dist, "29556")
    try:
        hz = clock_hz(torch)
        torch.cuda._sleep(1)  # the spin kernel's own first launch, before any probe
        torch.cuda.synchronize()
        return probe(gpu_actions(torch, dist), lambda s: torch.cuda._sleep(int(s * hz)), torch.cuda.synchronize,
                     hold_s)
    finally:
        dist.destroy_process_group()


def _world1_nccl(torch, dist, port: str) -> None:
    import os

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", port)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))


def host_call_us(calls: int = 500) -> float:
    """torch.distributed's host cost per call: perf_counter around `calls` in-place
    all_reduces of 8 B on a world-1 NCCL group, after 50 unmeasured ones (us a call)."""
    import time

    import torch
    import torch.distributed as dist

    _world1_nccl(torch, dist, "29555")
    try:
        x = torch.zeros(2, device="cuda")
        for _ in range(50):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(x)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        return (t1 - t0) / calls * 1e6
    finally:
        dist.destroy_process_group()
