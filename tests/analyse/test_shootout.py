"""The dispatcher shoot-out's analysis (analyse/shootout.py) on synthetic moe rows: the
ranking and ratios, the deciding stage, both GB/s, and the "clearly" rule with each reason
it cannot judge."""
from __future__ import annotations

import math

import pytest

from commbench.analyse import shootout as S
from conftest import make_row

BASE = {"tokens": 64, "hidden": 256, "experts": 8, "topk": 2, "routing": "uniform", "alpha": 1.0, "ratio": 2.0,
        "seed": 0, "copies": "rank", "mode": "normal", "path": "flat", "capacity": 0}


def launch(k: int) -> str:
    return f"{1000 + k}-{1_700_000_000_000_000_000 + k * 10**9}"


def point(disp, d_us, c_us, repeat=1, lid=None, spread_pct=5.0, run="r1", mode="normal", extra=None, **params):
    """A point's two rows (dispatch, combine) of dispatcher `disp` in repeat `repeat`,
    measured in launch `lid` (default: a launch of the repeat's own)."""
    p = {**BASE, **params, "dispatcher": disp, "mode": mode}
    lid = launch(repeat) if lid is None else lid
    out = []
    for stage, us, lap in (("dispatch", d_us, {"stage_us_a2a": d_us * 0.6, "stage_us_pack": d_us * 0.3}),
                           ("combine", c_us, {"stage_us_a2a": c_us * 0.5, "stage_us_reduce": c_us * 0.4})):
        out.append(make_row("moe", 2, 0, us, spread_pct=spread_pct, params=p, stage=stage, dtype="fp8",
                            run=run, repeat=repeat, launch=lid, logical_nbytes=1000, remote_nbytes=500,
                            **lap, **(extra or {})))
    return out


def three(disp, d_us, c_us, reps=3, **kw):
    return [r for k in range(1, reps + 1) for r in point(disp, d_us, c_us, repeat=k, **kw)]


def only(rows):
    cs = S.contests(rows)
    assert len(cs) == 1, [c.verdict() for c in cs]
    return cs[0]


def test_ranked_by_dispatch_plus_combine_with_exact_ratios_and_the_clearly_line():
    rows = three("deepep-normal", 80.0, 62.0) + three("allgather", 60.0, 40.0) + three("alltoall", 70.0, 61.0)
    c = S.contests(rows)[0]
    assert [e.dispatcher for e in c.entries] == ["allgather", "alltoall", "deepep-normal"]
    assert [e.total_us for e in c.entries] == [100.0, 131.0, 142.0]
    assert [e.x_best for e in c.entries] == [1.0, 1.31, 1.42]
    assert (c.entries[0].dispatch_us, c.entries[0].combine_us) == (60.0, 40.0)
    assert c.clearly and c.winner == "allgather" and c.table == "prefill"
    assert c.verdict() == "uniform: allgather 1.00, alltoall 1.31x, deepep-normal 1.42x (clearly, 3 repeats in " \
                          "fresh launches)"


def test_total_is_the_median_over_repeats_of_each_repeats_sum():
    rows = (point("a", 50, 50, 1) + point("a", 150, 150, 2) + point("a", 60, 50, 3)
            + three("b", 200, 200))
    e = only(rows).entries[0]
    assert (e.dispatcher, e.total_us, e.repeats) == ("a", 110.0, 3)
    assert (e.dispatch_us, e.combine_us) == (60.0, 50.0)


def test_algorithmic_and_physical_gbps_count_both_stages_bytes_over_the_total():
    e = only(three("a", 60.0, 40.0) + three("b", 90, 90)).entries[0]
    # (1000 + 1000) logical bytes and (500 + 500) remote bytes in 100 us.
    assert e.algorithmic_gbps == pytest.approx(0.02)
    assert e.physical_gbps == pytest.approx(0.01)


def test_the_deciding_stage_is_where_the_winner_gains_most_over_the_runner_up():
    c = only(three("fast", 60.0, 40.0) + three("slow", 50.0, 140.0))
    # combine: 100 us apart; inside it a2a (0.5 x) gains 50 us, reduce (0.4 x) 40 us.
    assert c.entries[0].deciding == "combine: a2a 50 us"
    assert c.entries[1].deciding == "combine: a2a 50 us"
    # The slower one gains in dispatch (10 us): a2a (0.6 x) 6 us of it.
    assert S.deciding_part(c.entries[1], c.entries[0]) == "dispatch: a2a 6 us"
    assert S.deciding_part(c.entries[0], c.entries[0]) == "-"


@pytest.mark.parametrize("reps, why", [(1, "one run each"), (2, "two runs each")])
def test_fewer_than_three_repeats_cannot_judge(reps, why):
    c = only(three("a", 10, 10, reps=reps) + three("b", 45, 45, reps=reps))
    assert not c.clearly and c.winner is None
    assert c.verdict() == f"uniform: a 1.00, b 4.50x (cannot judge: {why}; --repeat 3 to judge)"


def test_repeats_in_one_launch_cannot_judge():
    one = launch(1)
    c = only(three("a", 10, 10, lid=one) + three("b", 90, 90, lid=one))
    assert not c.clearly
    assert "not each in a fresh launch" in c.why and c.why.startswith("cannot judge")


def test_repeat_k_of_the_two_dispatchers_in_different_launches_cannot_judge():
    rows = three("a", 10, 10) + [r for k in (1, 2, 3) for r in point("b", 90, 90, k, lid=launch(10 + k))]
    c = only(rows)
    assert not c.clearly and "in repeat 1 the two dispatchers ran in different launches" in c.why


def test_rows_without_a_launch_id_cannot_judge():
    rows = three("a", 10, 10, lid="") + three("b", 90, 90, lid="")
    assert "not recorded as launches of their own" in only(rows).why


def test_pairs_that_disagree_cannot_judge():
    # Repeat 2 of the winner has a long tail: its p90 (10 + 10) x 1.5 is above b's p50 sum 26.
    rows = three("b", 13, 13) + point("a", 10, 10, 1) + point("a", 10, 10, 2, spread_pct=50.0) + \
        point("a", 10, 10, 3)
    c = only(rows)
    assert [e.dispatcher for e in c.entries] == ["a", "b"]
    assert not c.clearly
    assert "the repeats disagree (in 1 of 3 the winner's p90 is not below the runner-up's p50)" in c.why
    # The same rows without the tail: clearly.
    calm = three("b", 13, 13) + three("a", 10, 10)
    assert only(calm).clearly


def test_untrusted_rows_do_not_count_as_evidence():
    rows = three("a", 10, 10) + three("b", 90, 90)
    rows[-1]["disturbed"] = True  # b's combine in repeat 3
    c = only(rows)
    assert not c.clearly
    assert c.why == "cannot judge: 2 of 3 repeats usable; 1 row(s) not used: 1 disturbed while it ran"
    # Shown in the ranking all the same.
    assert c.entries[1].repeats == 3
    four = three("a", 10, 10, reps=4) + three("b", 90, 90, reps=4)
    four[-1]["warning"] = "disturbed: a rank waited"
    c4 = only(four)
    assert c4.clearly and c4.why == "3 repeats in fresh launches; 1 row(s) not used: 1 carries a warning"


def test_a_dispatcher_run_at_two_copy_settings_is_two_entries():
    rows = three("mpi-alltoallw", 10, 10, copies="rank") + three("mpi-alltoallw", 30, 30, copies="expert") + \
        three("alltoall", 20, 20, copies="expert")
    c = S.contests(rows)[0]
    assert [(e.dispatcher, e.total_us) for e in c.entries] == [
        ("mpi-alltoallw copies=rank", 20.0), ("alltoall", 40.0), ("mpi-alltoallw copies=expert", 60.0)]


def test_a_run_of_too_few_repeats_asks_for_three_whatever_was_disturbed():
    rows = three("a", 10, 10, reps=2) + three("b", 90, 90, reps=2)
    rows[-1]["disturbed"] = True
    assert only(rows).why == ("cannot judge: two runs each; 1 row(s) not used: 1 disturbed while it ran; "
                              "--repeat 3 to judge")
    every = three("a", 10, 10, reps=1) + three("b", 90, 90, reps=1)
    for r in every:
        r["disturbed"] = True
    assert only(every).why == ("cannot judge: one run each; 4 row(s) not used: 4 disturbed while it ran; "
                               "--repeat 3 to judge")


def test_a_dispatcher_that_failed_its_check_is_not_ranked():
    bad = three("c", 1, 1)
    for r in bad:
        r["check"] = "fail"
    c = only(three("a", 10, 10) + three("b", 20, 20) + bad)
    assert [e.dispatcher for e in c.entries] == ["a", "b"]
    assert c.failed == [("c", "failed its exact check")]


def test_prefill_and_decode_are_ranked_apart():
    rows = three("alltoall", 10, 10) + three("deepep-normal", 20, 20) + \
        three("low-latency", 5, 5, mode="low_latency", copies="expert", tokens=32)
    cs = S.contests(rows)
    assert [(c.table, [e.dispatcher for e in c.entries]) for c in cs] == [
        ("prefill", ["alltoall", "deepep-normal"]), ("decode", ["low-latency"])]
    assert cs[1].why == "one dispatcher ran: nothing to rank it against"
    assert "low-latency 1.00" in cs[1].verdict()


def test_a_dispatcher_that_serves_both_ranks_in_both_tables():
    rows = three("alltoall", 10, 10) + three("allgather", 20, 20) + \
        three("low-latency", 30, 30, mode="low_latency", copies="expert")
    got = [(c.table, [e.dispatcher for e in c.entries]) for c in S.contests(rows)]
    assert got == [("prefill", ["alltoall", "allgather"]), ("decode", ["allgather", "low-latency"])]
    assert S.tables_of("mpi-alltoallv", {"mode": "normal"}) == ("prefill", "decode")
    assert S.tables_of("a-plugin-not-loaded", {"mode": "normal"}) == ("prefill",)


def test_each_workload_is_its_own_contest_labelled_by_its_routing_and_knobs():
    rows = three("a", 10, 10) + three("b", 20, 20) + three("a", 30, 30, routing="zipf", alpha=1.2) + \
        three("b", 20, 20, routing="zipf", alpha=1.2) + three("a", 30, 30, seed=1) + three("b", 20, 20, seed=1)
    got = {c.workload: c.entries[0].dispatcher for c in S.contests(rows)}
    assert got == {"uniform seed=0": "a", "uniform seed=1": "b", "zipf alpha=1.2": "b"}


def test_workload_label_names_a_trace_and_steps():
    assert S.workload_label({"routing": "trace", "trace": "/data/run/routing.npz", "steps": 4}, 2) == \
        "trace routing.npz"
    # steps named where it tells two workloads apart, not where every workload has it.
    rows = three("a", 10, 10, steps=4) + three("b", 20, 20, steps=4)
    assert only(rows).workload == "uniform"
    rows += three("a", 10, 10, steps=2) + three("b", 20, 20, steps=2)
    assert sorted(c.workload for c in S.contests(rows)) == ["uniform steps=2", "uniform steps=4"]
    assert S.workload_label({"routing": "hot_rank", "ratio": 4.0}, 2) == "hot_rank ratio=4.0"


def test_no_shootout_with_one_dispatcher_or_none_named():
    assert S.contests(three("a", 10, 10)) == []
    assert not S.has_shootout(three("a", 10, 10))
    plain = [make_row("moe", 2, 0, 10.0, params=dict(BASE), stage="dispatch")]
    assert S.contests(plain) == [] and not S.has_shootout(plain)
    assert S.has_shootout(three("a", 10, 10) + three("b", 10, 10))
    # Two runs of one dispatcher each are not a shoot-out either.
    assert S.contests(three("a", 10, 10) + three("b", 10, 10, run="r2")) == []


def test_skipped_dispatchers_come_from_meta_skipped_points():
    meta = {"backend": "mpi", "skipped_points": [
        {"point_key": "k1", "benchmark": "moe", "params": {**BASE, "dispatcher": "deepep"}, "reason": "needs CUDA"},
        {"point_key": "k2", "benchmark": "moe", "params": {**BASE, "routing": "zipf", "dispatcher": "deepep"},
         "reason": "needs CUDA"},
        {"point_key": "k2|repeat2", "benchmark": "moe", "params": {**BASE, "routing": "zipf", "dispatcher": "deepep"},
         "reason": "needs CUDA"},
        {"point_key": "k3", "benchmark": "moe",
         "params": {**BASE, "dispatcher": "low-latency", "mode": "low_latency"}, "reason": "device path only"},
        {"point_key": "k4", "benchmark": "other", "params": {"dispatcher": "x"}, "reason": "-"}]}
    got = S.skipped({"r1": meta, "r2": None})
    assert got == [{"run": "r1", "backend": "mpi", "table": "prefill", "dispatcher": "deepep",
                    "reason": "needs CUDA", "points": 2},
                   {"run": "r1", "backend": "mpi", "table": "decode", "dispatcher": "low-latency",
                    "reason": "device path only", "points": 1}]


def test_nan_fields_from_a_frame_do_not_break_the_analysis():
    rows = three("a", 10, 10) + three("b", 20, 20)
    for r in rows:
        r["logical_nbytes"] = math.nan
        r["launch"] = r["launch"]
    e = only(rows).entries[0]
    assert math.isnan(e.algorithmic_gbps) and e.physical_gbps == pytest.approx(1000 / (20 * 1e3))


def test_a_tie_at_the_top_still_names_those_clearly_slower_than_the_fastest():
    # a and b within noise of each other (no winner); c twice as slow in every repeat: named,
    # by the same rule (the fastest's p90 below c's p50 in each of 3 fresh launches).
    rows = three("a", 10, 10) + three("b", 10.2, 10.2) + three("c", 20, 20)
    c = only(rows)
    assert not c.clearly and c.winner is None
    assert [e.clearly_slower for e in c.entries] == [False, False, True]
    assert c.verdict().endswith("; clearly slower than a: c)")
    # Two repeats only: nobody is named slower either.
    c2 = only(three("a", 10, 10, reps=2) + three("b", 10.2, 10.2, reps=2) + three("c", 20, 20, reps=2))
    assert not any(e.clearly_slower for e in c2.entries) and "clearly slower" not in c2.verdict()
