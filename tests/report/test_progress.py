"""Rank 0's progress: the time left weighs points by their planned time, and a point's line
names its size as the tables do and only the params that vary in the sweep."""
from commbench.report.progress import Progress
from commbench.run import suite as suite_mod
from commbench.run.plan import point_seconds


def _points(raw, world=2):
    cfg = suite_mod.build_config(dict(raw, name="t"))
    points, _ = suite_mod.expand(cfg, world, ("float32",))
    return cfg, points


def test_weights_follow_the_planned_time_and_labels_name_what_varies():
    cfg, points = _points({"benchmarks": ["all_reduce"], "sizes": ["8", "4M"], "iters": 10, "warmup": 1})
    pr = Progress(points, enabled=False, weight_s=lambda p: point_seconds(cfg, p))
    small, big = sorted(points, key=lambda p: p.nbytes)
    assert pr.weight[id(big)] == point_seconds(cfg, big) > pr.weight[id(small)] == point_seconds(cfg, small)
    assert pr.label(big) == "all_reduce w2 4M float32"

    cfg, points = _points({"benchmarks": ["moe"], "params": {"moe": {"tokens": 64, "hidden": 256, "experts": 8,
                                                                    "topk": 2, "routing": ["uniform", "zipf"]}}})
    pr = Progress(points, enabled=False, weight_s=lambda p: point_seconds(cfg, p))
    labels = sorted(pr.label(p) for p in points)
    assert any("routing=zipf" in x for x in labels) and any("routing=uniform" in x for x in labels)
    assert not any("tokens=" in x or "topk=" in x for x in labels)  # the same in every point: not named
