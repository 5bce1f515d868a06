"""Rank 0's progress through a sweep: a bar on a terminal, one plain line per point
otherwise."""
from __future__ import annotations

import os
import sys
from typing import Callable

from commbench.benchmarks import get
from commbench.core.units import fmt_size
from commbench.report.terminal import stdout_is_tty

# The rows of one point a progress line shows (a pairs point has one row a pair and repeat).
SHOWN_ROWS = 4


class Progress:
    """Rank 0's progress: a rich bar on a terminal, one plain line per point otherwise.

    The bar's time left weighs each point by its planned time (weight_s: the run's
    plan.point_seconds), not
    by count: a sweep's last, largest points take most of its time, and a per-point rate
    would promise an end long before it comes. Under mpirun rank 0's stdout is a pipe to
    mpirun (or a pseudo-terminal of mpirun's) even when the user sits at a terminal, and
    mpirun passes output on a line at a time: the bar is drawn on the launcher's terminal device
    (COMMBENCH_TTY_PATH) instead, or it would show only at the end."""

    def __init__(self, todo: list, enabled: bool, weight_s: Callable[[object], float]):
        self.enabled = enabled
        self.tty = enabled and stdout_is_tty()
        self.total, self.done = len(todo), 0
        self.weight = {id(p): weight_s(p) for p in todo}
        # Parameters named in a point's line: only those that vary within its benchmark.
        self.varying = {}
        for p in todo:
            for k, v in p.params.items():
                self.varying.setdefault(p.benchmark, {}).setdefault(k, set()).add(repr(v))
        if self.tty:
            from rich.console import Console
            from rich.progress import BarColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
            from rich.progress import Progress as RP

            self._tty_file = None
            path = os.environ.get("COMMBENCH_TTY_PATH")
            if path and path != _ttyname(sys.stdout):  # mpirun's own pseudo-terminal is not the user's
                try:
                    self._tty_file = open(path, "w", buffering=1)
                except OSError:
                    pass
            console = Console(file=self._tty_file, force_terminal=True, highlight=False)
            self.bar = RP(TextColumn("{task.description}"), BarColumn(),
                          TextColumn("{task.fields[points]}"), TimeElapsedColumn(), TextColumn("left"),
                          TimeRemainingColumn(), console=console, refresh_per_second=4)
            self.task = self.bar.add_task("sweep", total=sum(self.weight.values()) or 1.0,
                                          points=f"0/{self.total}")
            self.bar.start()

    def label(self, point) -> str:
        vary = self.varying.get(point.benchmark, {})
        params = " ".join(f"{k}={v}" for k, v in point.params.items() if len(vary.get(k, ())) > 1)
        # A benchmark without sizes (moe) has no size or dtype to name: its params say its point.
        sized = get(point.benchmark).sized
        return " ".join(x for x in (f"{point.benchmark} w{point.world}", fmt_size(point.nbytes) if sized else "",
                                    point.dtype if sized else "", "in-place" if point.in_place else "", params) if x)

    def skipped(self, point):
        """A point that could not run here (no rows; the sweep says why): counted."""
        self.done += 1
        if self.tty:
            self.bar.update(self.task, advance=self.weight.get(id(point), 1.0), points=f"{self.done}/{self.total}")

    def update(self, point, rows):
        self.done += 1
        if not self.enabled:
            return
        desc = self.label(point)
        if self.tty:
            self.bar.update(self.task, advance=self.weight.get(id(point), 1.0), description=desc,
                            points=f"{self.done}/{self.total}")
        else:
            figs = "; ".join(f"{r.get('stage') or 'p50'} {r['time_us_p50']:.2f} us " + (
                f"{r['remote_gbps']:.3f} GB/s ours" if r.get("remote_gbps") is not None  # moe: the tables' rate
                else f"busbw {r['busbw_gbps']:.3f} GB/s") for r in rows[:SHOWN_ROWS])
            if len(rows) > SHOWN_ROWS:  # a point of many rows (pairs: one a pair and repeat)
                figs += f"; and {len(rows) - SHOWN_ROWS} more rows"
            print(f"[{self.done}/{self.total}] {desc}: {figs}; check {rows[0]['check']}", flush=True)

    def close(self):
        if self.tty:
            self.bar.stop()
            if self._tty_file is not None:
                self._tty_file.close()
                self._tty_file = None


def _ttyname(f) -> str | None:
    try:
        return os.ttyname(f.fileno())
    except (OSError, ValueError, AttributeError):
        return None
