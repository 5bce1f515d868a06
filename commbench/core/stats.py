"""Per-point statistics of iteration times (pure numpy)."""
from __future__ import annotations

import numpy as np


def summarize_us(times_s: np.ndarray) -> dict[str, float]:
    """time_us_* fields from per-iteration times in seconds."""
    t = np.asarray(times_s, dtype=np.float64) * 1e6
    if t.size == 0:
        raise ValueError("no samples")
    p50, p90, p99 = np.percentile(t, [50, 90, 99])
    return {
        "time_us_min": float(t.min()),
        "time_us_p50": float(p50),
        "time_us_mean": float(t.mean()),
        "time_us_p90": float(p90),
        "time_us_p99": float(p99),
        "time_us_max": float(t.max()),
        "time_us_std": float(t.std(ddof=1)) if t.size > 1 else 0.0,
    }


def bandwidths_gbps(nbytes: int, time_us: float, busbw_factor: float) -> tuple[float, float]:
    """algbw = S/t, busbw = algbw * F (nccl-tests); GB = 1e9 bytes."""
    if time_us <= 0 or nbytes == 0:
        return 0.0, 0.0
    algbw = nbytes / (time_us * 1e-6) / 1e9
    return algbw, algbw * busbw_factor


def calibrate_iters(est_op_s: float, min_time_s: float, min_iters: int, max_iters: int) -> int:
    """Iterations so a point lasts about min_time_s: small messages get many samples and
    large ones do not take minutes."""
    if est_op_s <= 0:
        return max_iters
    n = int(np.ceil(min_time_s / est_op_s))
    return int(min(max(n, min_iters), max_iters))
