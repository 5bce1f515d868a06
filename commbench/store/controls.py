"""The control measurements a run's meta.json holds (backends/control.py measures them):
`controls`, a list with one entry per measurement, at the start and at the end of each
launch into the run (a run of N launches holds 2N):

    {"launch": id, "variant": name, "repeat": int, "when": "start" | "end",
     "unix_s": time.time() when measured, "cpu_loop_us": float, "pingpong_us": float | None,
     "method": one line}

Runs without it (older runs, imports) read as having none. The run's record writes them
(RunRecord.add_control); this module reads them."""
from __future__ import annotations

import math

WHEN = ("start", "end")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def controls_of(meta: dict) -> list[dict]:
    """The well-formed entries of a meta.json, in the order they were measured (unix_s); an
    entry without a time or a finite cpu_loop_us is left out, so a hand-edited or damaged
    record cannot pass for a measurement."""
    raw = meta.get("controls") if isinstance(meta, dict) else None
    if not isinstance(raw, list):
        return []
    out = [e for e in raw if isinstance(e, dict) and _number(e.get("unix_s")) and _number(e.get("cpu_loop_us"))
           and e.get("when") in WHEN]
    return sorted(out, key=lambda e: e["unix_s"])
