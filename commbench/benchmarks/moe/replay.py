"""The `trace` parameter: a captured routing file replayed in place of a generated routing.

A trace sets what its file says: the routing ("trace"), the expert count E, the top-k K, the
steps a point cycles through, and the tokens per rank (its tokens a step over the world,
split in order). A value of those given as well, that disagrees, is refused rather than
quietly overruled: the rows would otherwise say a shape that was never measured. The file
is read once per process (moe.trace.cached_trace), however many points and worlds ask.
"""
from __future__ import annotations

from commbench.core.errors import UsageError
from commbench.moe.trace import Trace, cached_trace

# The params a trace sets, and the trace's attribute each comes from.
SET_BY_TRACE = {"experts": "num_experts", "topk": "top_k", "steps": "steps"}


def trace_of(p: dict) -> Trace | None:
    """The point's trace (None without one); a bad file is one UsageError line."""
    path = p.get("trace") or ""
    if not path:
        return None
    try:
        return cached_trace(path)
    except ValueError as e:
        raise UsageError(f"moe: {e}") from None


def canonical(params: dict, defaults: dict) -> dict:
    """A point's params with what the trace sets filled in where the param was left at its
    default (a value given that disagrees stays, for validate() to refuse)."""
    tr = trace_of(params)
    if tr is None:
        return params
    out = {**params, "routing": "trace"}
    for key, attr in SET_BY_TRACE.items():
        if key in out and out[key] == defaults.get(key):
            out[key] = getattr(tr, attr)
    return out


def _conflict(tr: Trace, key: str, given, implied) -> UsageError:
    return UsageError(f"moe: {key}={given} conflicts with trace {tr.name}, which implies {key}={implied}: "
                      f"drop moe.{key} (the trace sets it)")


def refusal(params: dict) -> str | None:
    """Values given in the suite or by --param (params: only those given) that disagree with
    the trace, said before any rank starts; a value equal to the default is caught here, where
    it is known to have been given."""
    tr = trace_of({"trace": params.get("trace")}) if isinstance(params.get("trace"), str) else None
    if tr is None:
        return None
    if params.get("routing") is not None:  # no generator runs: the trace is the routing
        return (f"moe: routing={params['routing']} conflicts with trace {tr.name}, which is the routing: drop "
                f"moe.routing")
    for key, attr in SET_BY_TRACE.items():
        for v in params.get(key, []) if isinstance(params.get(key), list) else [params.get(key)]:
            if v is not None and v != getattr(tr, attr):
                return str(_conflict(tr, key, v, getattr(tr, attr)))
    for v in params.get("tokens", []) if isinstance(params.get("tokens"), list) else [params.get("tokens")]:
        if isinstance(v, int) and (v < 1 or tr.tokens % v):
            return (f"moe: tokens={v} conflicts with trace {tr.name}: its {tr.tokens} tokens a step split over the "
                    f"world set the tokens per rank: drop moe.tokens (the trace sets it)")
    return None


def validate(point, defaults: dict) -> None:
    """Refuse a world the trace does not split over and values that disagree with it; set
    the point's tokens per rank (trace tokens a step / world)."""
    p, world = point.params, point.world
    tr = trace_of(p)
    if tr is None:
        return
    try:
        tr.check_world(world)
    except ValueError as e:
        raise UsageError(f"moe: {e}") from None
    for key, attr in SET_BY_TRACE.items():
        if key in p and p[key] != getattr(tr, attr):
            raise _conflict(tr, key, p[key], getattr(tr, attr))
    per_rank = tr.tokens // world
    if p["tokens"] not in (per_rank, defaults["tokens"]):
        raise _conflict(tr, "tokens", p["tokens"], per_rank)
    point.params = {**p, "tokens": per_rank}


def row_info(p: dict, world: int) -> dict:
    """What rows replaying a trace carry: the file (name and sha256 prefix) and, recorded at
    another EP size, what the replay did about it."""
    tr = trace_of(p)
    if tr is None:
        return {}
    info = {"trace": tr.label}
    note = tr.reshard_note(world)
    if note:
        info["trace_note"] = note
    return info
