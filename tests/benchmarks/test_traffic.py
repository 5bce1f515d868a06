"""Bytes and busbw factors exactly as README "Formulas" states them."""
import pytest

from commbench.benchmarks import Point, get, registry

WORLDS = [1, 2, 4, 8, 72]


@pytest.mark.parametrize("n", WORLDS)
def test_busbw_factors(n):
    want = {"all_reduce": 2 * (n - 1) / n, "reduce_scatter": (n - 1) / n, "all_gather": (n - 1) / n,
            "all_to_all": (n - 1) / n, "broadcast": 1.0, "send_recv": 1.0, "barrier": 0.0}
    for name, f in want.items():
        t = get(name).traffic(Point(name, n, "float32", 1 << 20))
        assert t.busbw_factor == pytest.approx(f), name
        assert t.nbytes == (0 if name == "barrier" else 1 << 20)


def test_units_of_split_collectives():
    for name in ("reduce_scatter", "all_gather", "all_to_all"):
        assert get(name).unit_nbytes(4, 4, {}) == 16
    assert get("all_reduce").unit_nbytes(4, 2, {}) == 2


def test_registry_refuses_duplicates():
    from commbench.benchmarks.base import register
    from commbench.benchmarks.collectives import AllReduce

    with pytest.raises(ValueError, match="twice"):
        @register
        class Again(AllReduce):
            name = "all_reduce"
    assert "all_reduce" in registry()


def test_pattern_stays_exact():
    from commbench.benchmarks.base import EXACT_INT_LIMIT, pattern

    for dtype, limit in EXACT_INT_LIMIT.items():
        for world in (2, 8, 64):
            p = pattern(1000, world - 1, dtype, world, reduce=True)
            assert p.max() * world <= limit, (dtype, world)
