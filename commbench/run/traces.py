"""A run keeps its own copy of every routing trace it replays: `<run>/traces/<sha256[:16]>.npz`
(compact: the checked arrays, compressed, with the original file's name and sha256), and its
spec names that copy. The ranks then read one small file the run owns, and a resume or a
report finds the routing the rows were measured with after the original moved or changed.

A benchmark param named `trace` holding a path is such a trace (the MoE benchmark's)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from commbench.core.errors import UsageError
from commbench.core.safe_write import make_dir, write_atomic
from commbench.moe.trace import cached_trace, compact_bytes

TRACE_PARAM = "trace"
TRACES_DIR = "traces"


def _copy(path: str, run_dir: Path) -> str:
    """The run's copy of the trace at path (written once: named by its content), as an
    absolute path."""
    try:
        trace = cached_trace(path)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if Path(path).resolve().parent == (run_dir / TRACES_DIR).resolve():
        return path  # already the run's own (a resume, a variant joining the run)
    folder = make_dir(run_dir / TRACES_DIR)
    dest = folder / f"{(trace.source_sha256 or trace.sha256)[:16]}.npz"
    if not dest.is_file():
        write_atomic(dest, compact_bytes(trace))
    return str(dest.resolve())


def keep_traces(spec):
    """spec with every trace param pointing at the run's copy (written here); unchanged
    when the run replays none."""
    params, changed = {}, False
    run_dir = Path(spec.out)
    for bench, table in spec.config.params.items():
        table = dict(table)
        value = table.get(TRACE_PARAM)
        if isinstance(value, str) and value:
            table[TRACE_PARAM] = _copy(value, run_dir)
        elif isinstance(value, list):
            table[TRACE_PARAM] = [_copy(v, run_dir) if isinstance(v, str) and v else v for v in value]
        changed |= table != spec.config.params[bench]
        params[bench] = table
    return replace(spec, config=replace(spec.config, params=params)) if changed else spec
