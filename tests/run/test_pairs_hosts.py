"""N hosts on one machine (tools/nhosts.py) and the pairs trials on them (tools/pairs_trials.py):
namespaces with their own hostnames on one bridge, an htb class per destination on each
host's eth0, so one link or one host's every link can be slowed; mpirun across them sees one
node per host; `commbench run pairs` over five of them names the one slow link.

The namespaces need root, iproute2 (ip, tc) and util-linux (nsenter, unshare); where they
cannot be made, the tests that make them skip and say why. The rates are compared as ratios
of streams measured at the same time, never as absolute figures.
"""
from __future__ import annotations

import importlib.util
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import nhosts
import pairs_trials

from conftest import run_meta

WHY_NOT = nhosts.NHosts.unavailable()
needs_hosts = pytest.mark.skipif(WHY_NOT is not None, reason=f"n hosts cannot be made here: {WHY_NOT}")
needs_mpi = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None
                               or (shutil.which("mpirun") is None and not (Path(sys.executable).parent / "mpirun").exists()),
                               reason="mpi4py or mpirun not installed")
BASE_MBIT = 200.0


def _up(n, **kw) -> nhosts.NHosts:
    nh = nhosts.NHosts(n, **kw)
    try:
        nh.up()
    except nhosts.Unavailable as e:
        pytest.skip(str(e))
    return nh


def _made(nh) -> list[str]:
    """What of a set still exists: namespaces, UTS mounts, state and scratch directories."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    mounts = Path("/proc/self/mountinfo").read_text()
    return ([ns for ns in [h.ns for h in nh.hosts] + [nh.hub_ns] if ns in listed]
            + [h.uts for h in nh.hosts if h.uts in mounts] + [str(d) for d in (nh.state, nh.scratch) if d.exists()])


@pytest.fixture(scope="module")
def three():
    nh = _up(3, rate_mbit=BASE_MBIT)
    yield nh
    nh.down()


# --- pure: the shaper's commands and the trials' judgement --------------------------------

def test_each_host_gets_a_class_and_a_destination_filter_per_other_host():
    addrs = ["198.18.0.1", "198.18.0.2", "198.18.0.3", "198.18.0.4"]
    batch = nhosts.htb_batch(1, addrs, {0: 200, 2: 66.5, 3: 200}).splitlines()
    assert batch[0] == "qdisc replace dev eth0 root handle 1: htb default 1"
    classes = [x for x in batch if x.startswith("class add") and "classid 1:1 " not in x]
    filters = [x for x in batch if x.startswith("filter add")]
    assert [c.split("classid ")[1].split()[0] for c in classes] == ["1:10", "1:12", "1:13"]  # none towards itself
    assert "rate 66.5mbit ceil 66.5mbit" in classes[1] and "rate 200mbit ceil 200mbit" in classes[0]
    assert [f.split("match ip dst ")[1].split()[0] for f in filters] == ["198.18.0.1/32", "198.18.0.3/32",
                                                                         "198.18.0.4/32"]
    assert [f.split("flowid ")[1] for f in filters] == ["1:10", "1:12", "1:13"]


def test_hosts_are_named_by_number_hostname_or_letter_and_bad_counts_refused():
    nh = nhosts.NHosts(4)  # not up: names only
    assert [h.hostname for h in nh.hosts] == ["cbhost-a", "cbhost-b", "cbhost-c", "cbhost-d"]
    assert [h.addr for h in nh.hosts][-1] == "198.18.0.4"
    assert nh.index(2) == nh.index("cbhost-c") == nh.index("c") == 2
    with pytest.raises(ValueError, match="no host 'cbhost-e'"):
        nh.index("cbhost-e")
    for bad in (1, 9):
        with pytest.raises(ValueError, match="n must be 2 to 8"):
            nhosts.NHosts(bad)
    with pytest.raises(ValueError, match="rate_mbit must be positive"):
        nhosts.NHosts(3, rate_mbit=0)


def test_trials_judge_the_verdict_against_what_was_shaped():
    names = [f"cbhost-{s}" for s in "abcde"]
    assert [pairs_trials.shaped_for("a", t, names) for t in (0, 1, 10)] == [
        ("cbhost-a", "cbhost-b"), ("cbhost-a", "cbhost-c"), ("cbhost-a", "cbhost-b")]
    assert pairs_trials.shaped_for("b", 6, names) == "cbhost-b" and pairs_trials.shaped_for("c", 0, names) is None
    link = {"slow_nodes": [], "slow_links": [["cbhost-c", "cbhost-b"]]}
    node = {"slow_nodes": ["cbhost-b"], "slow_links": []}
    clean = {"slow_nodes": [], "slow_links": []}
    assert pairs_trials.judged_right("a", ("cbhost-b", "cbhost-c"), link)
    assert not pairs_trials.judged_right("a", ("cbhost-b", "cbhost-d"), link)
    assert not pairs_trials.judged_right("a", ("cbhost-b", "cbhost-c"), {**link, "slow_nodes": ["cbhost-b"]})
    assert pairs_trials.judged_right("b", "cbhost-b", node) and not pairs_trials.judged_right("b", "cbhost-c", node)
    assert not pairs_trials.judged_right("b", "cbhost-b", {**node, "slow_links": [["cbhost-a", "cbhost-c"]]})
    assert pairs_trials.judged_right("c", None, clean) and not pairs_trials.judged_right("c", None, link)
    odd = {**clean, "slow_pairs": [["cbhost-b", "cbhost-c"]]}  # low, but neither one link nor one node
    assert not pairs_trials.judged_right("c", None, odd)
    assert not pairs_trials.judged_right("a", ("cbhost-b", "cbhost-c"), {**odd, **link})
    assert not pairs_trials.judged_right("c", None, None)  # a run without a verdict is not right
    assert pairs_trials.parse_trials("a=10,b=10,c=20") == {"a": 10, "b": 10, "c": 20}
    assert [pairs_trials.target_count(s, n) for s, n in (("a", 10), ("b", 1), ("c", 20), ("c", 1))] == [9, 1, 19, 1]
    with pytest.raises(SystemExit, match="--trials takes a=N"):
        pairs_trials.parse_trials("d=3")


def test_the_summary_counts_right_runs_against_each_target():
    runs = [{"scenario": "a", "ok": i != 0, "line": "link x-y" if i else "no outlier"} for i in range(10)]
    runs += [{"scenario": "c", "ok": i > 1, "line": "no outlier"} for i in range(20)]
    lines, met = pairs_trials.summary(runs, {"a": 10, "c": 20})
    assert not met
    assert lines[0].startswith("a (one link at a third): 9 of 10 right (target: at least 9) met")
    assert any(x.startswith("c (nothing shaped): 18 of 20 right (target: at least 19) MISSED") for x in lines)
    assert "    9x  link x-y" in lines


# --- the hosts -----------------------------------------------------------------------------

@needs_hosts
@needs_mpi
@pytest.mark.multirank
def test_three_hosts_have_their_own_hostnames_and_mpirun_sees_three_nodes(three, tmp_path):
    names = [subprocess.run(h.cmd(["hostname"]), capture_output=True, text=True, check=True).stdout.strip()
             for h in three.hosts]
    assert names == ["cbhost-a", "cbhost-b", "cbhost-c"]
    out = tmp_path / "run"
    p = three.mpirun(3, ["run", "quick", "--backend", "mpi", "-b", "all_reduce", "--sizes", "4K", "--worlds", "3",
                         "--profile", "loopback", "--nic-gbps", "1", "--timeout", "60", "--out", out], timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    meta = run_meta(out)
    assert meta["hosts"] == names and meta["nodes"] == [0, 1, 2]
    assert three.hostfile(2).read_text() == "cbhost-a slots=2\ncbhost-b slots=2\ncbhost-c slots=2\n"


@needs_hosts
@pytest.mark.multirank
def test_a_shaped_link_or_host_is_slower_and_the_other_links_are_not(three):
    """Streams measured at once, so the machine's load is the same for all of them: a link
    at a quarter of the base carries at most half of what an unshaped one does, both ways, and
    still carries some; a shaped host slows its own links only. No lower bound near the quarter:
    a TCP stream through the shaper ramps up after its drops, which a loaded host slows (b to a
    measured 0.053 of b to c in 1 s, a to b 0.25 at once)."""
    try:
        three.shape("a", "b", BASE_MBIT / 4)
        ab, ba, ac, bc = three.link_rates_mbit([("a", "b"), ("b", "a"), ("a", "c"), ("b", "c")], 1.0)
        assert 0 < ab / ac < 0.5 and 0 < ba / bc < 0.5, (ab, ba, ac, bc)
        assert 0.7 < ac / bc < 1.4, (ac, bc)  # the unshaped links alike
        three.reset()
        three.shape_host("c", BASE_MBIT / 4)
        ab, ac, cb = three.link_rates_mbit([("a", "b"), ("a", "c"), ("c", "b")], 1.0)
        assert 0 < ac / ab < 0.5 and 0 < cb / ab < 0.5, (ab, ac, cb)
        three.reset()
        ab, ac = three.link_rates_mbit([("a", "b"), ("a", "c")], 1.0)
        assert 0.7 < ab / ac < 1.4, (ab, ac)  # reset: the same rate again
    finally:
        three.reset()


@needs_hosts
@pytest.mark.multirank
def test_teardown_after_an_error_and_after_the_owner_is_killed():
    nh = nhosts.NHosts(3)
    with pytest.raises(RuntimeError, match="a test failing"):
        try:
            with nh:
                assert len(_made(nh)) == 4 + 3 + 2  # 3 hosts and the hub, 3 UTS mounts, state and scratch
                raise RuntimeError("a test failing inside the set")
        except nhosts.Unavailable as e:
            pytest.skip(str(e))
    assert _made(nh) == []

    # An owner killed with SIGKILL: no handler runs, the reaper removes its hosts.
    code = ("import sys, time; sys.path.insert(0, sys.argv[1]); import nhosts\n"
            "nh = nhosts.NHosts(2).up(); print(nh.tag, flush=True); time.sleep(600)\n")
    owner = subprocess.Popen([sys.executable, "-c", code, str(ROOT / "tools")], stdout=subprocess.PIPE, text=True)
    tag = owner.stdout.readline().strip()
    assert tag, "the owner made no hosts"
    orphan = nhosts.NHosts(2, tag=tag)
    assert len(_made(orphan)) == 3 + 2 + 2
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    end = time.monotonic() + 30
    while _made(orphan) and time.monotonic() < end:
        time.sleep(0.2)
    assert _made(orphan) == []


# --- the trials ----------------------------------------------------------------------------

@needs_hosts
@needs_mpi
@pytest.mark.multirank
def test_a_trial_on_five_hosts_names_the_slow_link(tmp_path):
    """One run of scenario a (one link of five hosts at a third of the base rate): the
    verdict names that link and no node."""
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "pairs_trials.py"), "--trials", "a=1", "--retests", "2",
                        "--out", tmp_path], capture_output=True, text=True, timeout=600, cwd=ROOT)
    if p.returncode == 3:
        pytest.skip(p.stderr.strip())
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert "a01 shaped cbhost-a-cbhost-b    right" in p.stdout, p.stdout
    assert "link cbhost-a-cbhost-b: " in p.stdout and "a (one link at a third): 1 of 1 right" in p.stdout
