import numpy as np
import pytest

from commbench.core.errors import UsageError
from commbench.core.stats import bandwidths_gbps, calibrate_iters, summarize_us
from commbench.core.units import fmt_size, parse_size, parse_sizes_arg, size_range


@pytest.mark.parametrize("text,want", [("8", 8), ("4K", 4096), ("4M", 4 << 20), ("1G", 1 << 30),
                                       ("64KiB", 65536), ("2kb", 2048), (16, 16)])
def test_parse_size(text, want):
    assert parse_size(text) == want


@pytest.mark.parametrize("bad", ["0", "-4", "4X", "", "1.5M", True])
def test_parse_size_rejects(bad):
    with pytest.raises(UsageError):
        parse_size(bad)


def test_size_range_and_errors():
    assert size_range(8, 64, 2) == [8, 16, 32, 64]
    assert size_range(8, 100, 4) == [8, 32]
    with pytest.raises(UsageError, match="inverted"):
        size_range(64, 8, 2)
    with pytest.raises(UsageError, match="factor"):
        size_range(8, 64, 1)


def test_parse_sizes_arg():
    assert parse_sizes_arg("8:4M") == {"min": "8", "max": "4M", "factor": 2}
    assert parse_sizes_arg("8:4M:4")["factor"] == 4
    assert parse_sizes_arg("8,1K") == ["8", "1K"]
    with pytest.raises(UsageError):
        parse_sizes_arg("8:4M:x")
    assert fmt_size(4 << 20) == "4M" and fmt_size(1000) == "1000"


def test_summarize_us():
    t = np.array([1e-6, 2e-6, 3e-6, 4e-6, 100e-6])
    s = summarize_us(t)
    assert s["time_us_min"] == pytest.approx(1) and s["time_us_max"] == pytest.approx(100)
    assert s["time_us_p50"] == pytest.approx(3) and s["time_us_mean"] == pytest.approx(22)
    assert s["time_us_p90"] == pytest.approx(np.percentile([1, 2, 3, 4, 100], 90))
    assert s["time_us_std"] == pytest.approx(np.std([1, 2, 3, 4, 100], ddof=1))


def test_bandwidths_and_calibration():
    algbw, busbw = bandwidths_gbps(1_000_000, 10.0, 1.5)  # 1 MB in 10 us = 100 GB/s
    assert algbw == pytest.approx(100.0) and busbw == pytest.approx(150.0)
    assert bandwidths_gbps(0, 5.0, 1.0) == (0.0, 0.0)
    assert calibrate_iters(1e-3, 0.05, 5, 1000) == 50
    assert calibrate_iters(1.0, 0.05, 5, 1000) == 5
    assert calibrate_iters(1e-9, 0.05, 5, 1000) == 1000
