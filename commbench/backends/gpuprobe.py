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
