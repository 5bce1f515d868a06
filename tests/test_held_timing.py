"""Held batches against a simulated device stream: the host pays a launch cost per call,
the device runs what was enqueued in order, events are stamped when the device reaches
them, and a hold keeps the device from starting until it is released. This is the model
in which per-operation events on an idle stream read the host's cost, and held batches
read the device's."""
from __future__ import annotations

import numpy as np
import pytest

from commbench.backends import timing


class Stream:
    """One device stream and the host that feeds it, on simulated clocks (seconds)."""

    def __init__(self, launch_s: float):
        self.host = 0.0
        self.launch_s = launch_s
        self.items: list = []   # (kind, host time enqueued, payload)
        self.log: list = []

    def op(self, device_s: float):
        def run():
            self.host += self.launch_s
            self.items.append(("op", self.host, device_s))
            self.log.append("op")
        return run

    def event(self):
        stream = self

        class Ev:
            t = None

            def record(self):
                stream.items.append(("event", stream.host, self))

            def elapsed_time(self, end):
                return (end.t - self.t) * 1e3
        return Ev()

    def hold(self, expected_s: float = 0.0, cap_s: float = 1.0):
        stream = self

        class H(timing.Hold):
            released = None

            def release(self):
                self.released = stream.host
                stream.log.append("release")

            def covered(self):
                return self.expired is False

        h = H()
        h.expired = None
        self.items.append(("hold", self.host, (h, cap_s)))
        self.log.append("hold")
        return h

    def synchronize(self):
        """Run the device over everything enqueued."""
        t = 0.0
        for kind, at, payload in self.items:
            t = max(t, at)
            if kind == "op":
                t += payload
            elif kind == "event":
                payload.t = t
            else:
                h, cap = payload
                end = t + cap
                h.expired = h.released is None or h.released > end
                t = min(end, h.released) if h.released is not None else end
        self.items.clear()
        self.log.append("sync")


def test_idle_stream_events_read_the_host_cost():
    s = Stream(launch_s=25e-6)
    t = timing.time_with_events(s.op(1e-6), 5, s.event, s.synchronize)
    np.testing.assert_allclose(t, 25e-6, rtol=0.05)  # host time, not the 1 us of device work


def test_held_batch_reads_device_time_and_host_cost_beside_it():
    s = Stream(launch_s=25e-6)
    meets = []
    r = timing.time_held(s.op(1e-6), 4, 50, s.hold, s.event, s.synchronize, meet=lambda: meets.append(1),
                         elapsed=lambda a, b: a.elapsed_time(b), clock=lambda: s.host)
    np.testing.assert_allclose(r.samples_s, 1e-6, rtol=1e-6)
    np.testing.assert_allclose(r.host_s_per_op, 25e-6, rtol=1e-6)
    assert r.held.all() and len(meets) == 4 and r.ops_per_batch == 50
    info = r.info()
    assert info["held"] and info["unheld_samples"] == 0 and info["ops_per_sample"] == 50
    assert info["host_us_per_op"] == pytest.approx(25.0)
    assert "mean of 50 operations" in info["sample"]
    # each batch: hold, its ops, then release (after the meet), one sync at the end
    assert s.log[:52] == ["hold"] + ["op"] * 50 + ["release"] and s.log[-1] == "sync"


def test_a_hold_that_expires_is_flagged_not_hidden():
    s = Stream(launch_s=25e-6)
    # The cap (100 us) runs out while the host still enqueues 50 ops (1.25 ms): the batch's
    # first operations start before the last are enqueued, so its time holds host cost.
    r = timing.time_held(s.op(1e-6), 3, 50, lambda e: s.hold(e, cap_s=1e-4), s.event, s.synchronize,
                         clock=lambda: s.host)
    assert not r.held.any()
    info = r.info()
    assert info["held"] is False and info["unheld_samples"] == 3
    assert r.samples_s.mean() > 10e-6  # the host's pace shows: that is why it is flagged


def test_per_op_pairs_cost_is_in_each_sample_and_samples_are_per_op():
    s = Stream(launch_s=25e-6)
    r = timing.time_held(s.op(2e-6), 2, 10, s.hold, s.event, s.synchronize, per_op=True, clock=lambda: s.host)
    assert r.samples_s.shape == (20,) and r.held.shape == (20,)
    np.testing.assert_allclose(r.samples_s, 2e-6, rtol=1e-6)
    assert r.info()["ops_per_sample"] == 1


def test_batch_sizing():
    assert timing.choose_ops_per_batch(1e-6) == 200        # capped
    assert timing.choose_ops_per_batch(1e-5) == 20         # 200 us of work
    assert timing.choose_ops_per_batch(1e-3) == 1          # one long operation
    assert timing.choose_ops_per_batch(float("nan")) == 200
    with pytest.raises(ValueError):
        timing.time_held(lambda: None, 1, 0, timing.NoHold, object, lambda: None)
