import pytest

from commbench.errors import UsageError
from commbench.suite import build_config, expand, list_suites, read_suite, resolve_worlds

F32 = ("float32", "float16", "int32")


def cfg(**kw):
    return build_config({"name": "t", "benchmarks": ["all_reduce"], **kw})


def test_every_shipped_suite_validates():
    assert {"quick", "collectives"} <= set(list_suites())
    for name in list_suites():
        points, _ = expand(build_config(read_suite(name)), 8, ("float32", "bfloat16", "float16", "int32"))
        assert points


def test_quick_suite_shape():
    c = build_config(read_suite("quick"))
    pts, _ = expand(c, 4, F32)
    assert {p.world for p in pts} == {2, 4}
    assert max(p.nbytes for p in pts) == 4 << 20 and min(p.nbytes for p in pts if p.nbytes) == 8
    assert {p.benchmark for p in pts} == {"all_reduce", "reduce_scatter", "all_gather", "all_to_all",
                                          "broadcast", "send_recv", "barrier"}


def test_default_worlds_are_powers_of_two_plus_launch():
    assert resolve_worlds(cfg(), 8) == [2, 4, 8]
    assert resolve_worlds(cfg(), 6) == [2, 4, 6]
    assert resolve_worlds(cfg(max_world=4), 8) == [2, 4]
    with pytest.raises(UsageError, match="only 4 rank"):
        resolve_worlds(cfg(worlds=[8]), 4)


def test_cli_overrides_win():
    c = build_config({"name": "t", "benchmarks": ["all_reduce"], "iters": 5}, {"iters": 9, "benchmarks": ["barrier"]})
    assert c.iters == 9 and c.benchmarks == ("barrier",)


def test_rounding_and_rejection():
    c = cfg(benchmarks=["all_to_all"], sizes={"min": "24", "max": "24"})
    pts, notes = expand(c, 4, F32)  # 24 B over 4 ranks x 4 B: rounded to 16
    assert [p.nbytes for p in pts if p.world == 4] == [16]
    assert any("rounded down" in n for n in notes)
    with pytest.raises(UsageError, match="rejected"):
        expand(cfg(benchmarks=["all_to_all"], sizes=["24"]), 4, F32)
    pts, notes = expand(cfg(benchmarks=["all_to_all"], sizes=["8", "64"]), 4, F32)
    assert any("skipped" in n for n in notes)


@pytest.mark.parametrize("raw,msg", [
    ({"benchmarks": "all_reduce", "bogus": 1}, "unknown key 'bogus'"),
    ({"benchmarks": []}, "no benchmarks"),
    ({"benchmarks": ["all_reduce"], "sizes": []}, "empty list"),
    ({"benchmarks": ["all_reduce"], "sizes": {"min": "8"}}, "needs min and max"),
    ({"benchmarks": ["all_reduce"], "sizes": 8}, "must be a"),
    ({"benchmarks": ["all_reduce"], "dtypes": ["float8"]}, "unknown dtype"),
    ({"benchmarks": ["all_reduce"], "worlds": [0]}, "positive integers"),
    ({"benchmarks": ["all_reduce"], "iters": "many"}, "must be an integer"),
    ({"benchmarks": ["all_reduce"], "check": "yes"}, "true or false"),
    ({"benchmarks": ["all_reduce"], "min_time_ms": -1}, "positive"),
    ({"benchmarks": ["all_reduce"], "min_iters": 10, "max_iters": 5}, "min_iters"),
    ({"benchmarks": ["all_reduce"], "params": 3}, "table of tables"),
])
def test_bad_suites(raw, msg):
    with pytest.raises(UsageError, match=msg):
        build_config({"name": "t", **raw})


@pytest.mark.parametrize("kw,msg", [
    ({"benchmarks": ["nope"]}, "unknown benchmark"),
    ({"sizes": {"min": "4M", "max": "8"}}, "inverted"),
    ({"sizes": ["0"]}, "positive"),
    ({"dtypes": ["bfloat16"]}, "not supported"),
    ({"params": {"barrier": {"x": 1}}}, "does not run|unknown param"),
    ({"benchmarks": ["send_recv"], "worlds": [3]}, "even world"),
])
def test_impossible_sweeps(kw, msg):
    with pytest.raises(UsageError, match=msg):
        expand(cfg(**kw), 4, F32)
