"""`commbench model`: the what-if model's projections on hardware profiles (or on a fabric
calibrated from a measured run), or the model held against its table of published figures
(--against). The numbers are analyse.model's; the tables report/model_view.py's."""
from __future__ import annotations

from functools import lru_cache

from commbench.analyse import ceilings, moe_stacks
from commbench.analyse import model as M
from commbench.analyse import model_skew as MS
from commbench.analyse.analysis import fit_table
from commbench.analyse.model_check import check, default_table, load_table, summary
from commbench.benchmarks import registry
from commbench.core.errors import UsageError
from commbench.core.units import parse_sizes_arg, sweep_sizes
from commbench.moe import accounting
from commbench.moe import routing as R
from commbench.moe.trace import load_trace
from commbench.moe.workloads import parse_tokens_by_rank
from commbench.report.model_view import (
    against_table,
    assumptions_text,
    class_lines,
    fabric_title,
    left_out_lines,
    nccl_pick_line,
    projection_table,
    skew_lines,
    summary_lines,
)
from commbench.report.terminal import make_console, stdout_is_tty
from commbench.run.suite import parse_params
from commbench.store.load import load
from commbench.store.results import load_meta


def cmd_against(path, console, plain: bool) -> int:
    """Print the table and the summary; exit status 0 when the held-out rows pass, else 1 (also
    when no row is held out: nothing was tested)."""
    source = path or default_table()
    checked = check(load_table(source))
    console.print(against_table(checked, source, plain))
    s = summary(checked)
    for line in summary_lines(s) + class_lines(s["classes"]):
        console.print(line)
    return 0 if s["ok"] else 1


def model_command(args, profiles_of) -> int:
    """Projections on the profiles (profiles_of(default names)), or the model against its
    table of published figures (--against)."""
    console = make_console()
    plain = not stdout_is_tty()
    if args.against is not None:
        # each row of the table names its own profile, world, size and shape
        given = [f"--{k.replace('_', '-')}" for k in ("profile", "worlds", "sizes", "algos", "calibrate", "tokens",
                                                      "hidden", "experts", "topk", "max_groups", "nic_gbps",
                                                      "scaleup_GBps", "domain_gpus", "workload", "trace",
                                                      "dispatchers", "stack")
                 if getattr(args, k, None) is not None] + (["--rate"] if args.rate != "achieved" else []) \
            + (["--param"] if getattr(args, "param", None) else [])
        if given:
            raise UsageError(f"--against takes profiles, worlds, sizes and shapes from the table's rows; "
                             f"drop {', '.join(given)}")
        return cmd_against(args.against or None, console, plain)
    worlds = args.worlds or [8, 16, 32, 64, 128, 256, 512, 1024]
    if any(w < 1 for w in worlds):
        raise UsageError(f"--worlds must be positive, got {worlds}")
    sizes, _ = sweep_sizes(parse_sizes_arg("1M,64M,1G" if args.sizes is None else args.sizes))
    fabrics = []
    if args.calibrate:
        meta = load_meta(args.calibrate)
        fields = ((meta.get("ceilings") or {}).get("fields")) or {}
        if not fields:
            raise UsageError(f"{args.calibrate}: meta.json has no measured profile to calibrate")
        prof = ceilings.profile_from_fields(fields, f"{args.calibrate}: meta.json's ceilings")
        base = M.fabric_from_profile(prof, args.rate)
        fabrics.append((f"{prof.name} calibrated from {args.calibrate}", M.calibrate_fabric(fit_table(load(args.calibrate)), base)))
    else:
        for prof in profiles_of(["gb300-nvl72", "h100-hgx"]):
            if prof.measured and prof.scaleup_line_gbps is None:
                raise UsageError(f"profile {prof.name} is measured at run time: use --calibrate RUN_DIR")
            fabrics.append((prof.name, M.fabric_from_profile(prof, args.rate)))
    stack = getattr(args, "stack", None)
    if stack is not None:
        if args.kind != "moe":
            raise UsageError("--stack applies to --kind moe only")
        stack = moe_stacks.get_stack(stack).name  # one line naming the known stacks
        fabrics = [(f"{name}, stack {stack}", moe_stacks.with_stack(fab, stack)) for name, fab in fabrics]
    shape = _moe_shape(args)
    skew_of = _skew_of(args, shape, worlds)
    cases = _dispatchers(args)
    console.print(assumptions_text(M.ASSUMPTIONS + (moe_stacks.assumption_lines(stack) if args.kind == "moe" else [])))
    for name, fab in fabrics:
        skipped: list = []
        rows = M.project(args.kind, worlds, fab, sizes_nbytes=sizes, moe_shape=shape, algos=args.algos,
                         skipped=skipped, cases=cases, skew_of=skew_of)
        console.print(projection_table(args.kind, fabric_title(name, args.rate, fab), rows, plain))
        if args.kind == "all_reduce":  # what NCCL itself would run there, and why
            for p in worlds:
                for S in sizes:
                    console.print(nccl_pick_line(p, S, M.nccl_pick(p, S, fab)))
        for line in skew_lines(rows) + left_out_lines(skipped):
            console.print(line)
    return 0


def _moe_shape(args) -> dict:
    """The MoE shape the flags set (tokens, hidden, experts, topk, M), each checked."""
    for k in ("tokens", "hidden", "experts", "topk", "max_groups"):
        v = getattr(args, k)
        if v is not None and v < 1:  # a shape of nothing routes nothing: every case would be left out
            raise UsageError(f"--{k.replace('_', '-')} must be >= 1, got {v}")
    experts = args.experts or M.moe_scenario_defaults()["experts"]
    if args.topk is not None and args.topk > experts:
        raise UsageError(f"--topk {args.topk} exceeds the {experts} experts a token can be sent to")
    shape = {k: getattr(args, k.replace("-", "_")) for k in ("tokens", "hidden", "experts", "topk")
             if getattr(args, k) is not None}
    if args.max_groups is not None:
        shape["M"] = args.max_groups
    if "hidden" in shape:
        try:
            shape["token_nbytes"] = accounting.token_bytes(shape["hidden"], "fp8")
        except ValueError as e:
            raise UsageError(str(e)) from None
    return shape


def _dispatchers(args) -> tuple:
    """The MoE dispatchers the table models (--dispatchers; the model's MOE_DISPATCHERS)."""
    names = tuple(getattr(args, "dispatchers", None) or M.MOE_DEFAULT_DISPATCHERS)
    if getattr(args, "dispatchers", None) and args.kind != "moe":
        raise UsageError("--dispatchers applies to --kind moe only")
    for n in names:
        M.moe_case(n)  # UsageError naming the known ones
    return names


# Workload knobs that are not the routing's own but still change its load.
_WORKLOAD_KEYS = ("seed", "steps")


def _workload_knobs(name: str, items: list[str]) -> dict:
    """--param moe.KNOB=V (or KNOB=V) for workload `name`: its own knobs, seed and steps,
    typed as the moe benchmark's params; anything else is refused in one line."""
    own = R.ROUTING_PARAMS[name]
    parsed = parse_params(items, ("moe",))
    other = sorted(set(parsed) - {"moe"})
    if other:
        raise UsageError(f"--param {other[0]}.*: the model takes moe.KNOB=V (knobs of --workload {name})")
    params = registry()["moe"].params
    knobs = {}
    for key, value in parsed.get("moe", {}).items():
        if key not in own and key not in _WORKLOAD_KEYS:
            hint = (f"use --{key}" if key in ("tokens", "hidden", "experts", "topk") else
                    f"workload {name}'s knobs: {', '.join(own + _WORKLOAD_KEYS)}")
            raise UsageError(f"--param moe.{key} does not apply to the model's workload {name} ({hint})")
        if isinstance(value, list):
            raise UsageError(f"--param moe.{key}: one value (the model projects one workload)")
        knobs[key] = params[key].coerce("moe", key, value) if key in params else value
    return knobs


def _skew_of(args, shape: dict, worlds):
    """The skew at each world (model_skew) of --workload or --trace, or None: uniform rows only.
    A trace sets the experts and top-k; either is checked here, at the first world it fits,
    so a bad workload, knob or file ends in one line before any table."""
    workload, trace_path, items = getattr(args, "workload", None), getattr(args, "trace", None), \
        getattr(args, "param", None) or []
    if args.kind != "moe" and (workload or trace_path or items):
        raise UsageError("--workload, --trace and --param apply to --kind moe only")
    if workload and trace_path:
        raise UsageError("--workload and --trace each set the routing: give one")
    if items and not workload:
        raise UsageError("--param sets a --workload's knobs: name the workload (--workload NAME)")
    if not (workload or trace_path):
        return None
    if trace_path:
        try:
            trace = load_trace(trace_path)
        except ValueError as e:
            raise UsageError(str(e)) from None
        for k, v in (("experts", trace.num_experts), ("topk", trace.top_k)):
            if shape.get(k) is not None and shape[k] != v:
                raise UsageError(f"--{k} {shape[k]} conflicts with the trace's {v} ({trace_path})")
        shape.update(experts=trace.num_experts, topk=trace.top_k)
        return lru_cache(None)(lambda p, G: MS.trace_skew(trace, p, G))
    if workload not in R.ROUTINGS:
        raise UsageError(f"unknown workload {workload!r}; choose one of {', '.join(R.ROUTINGS)}")
    knobs = _workload_knobs(workload, items)
    full = {**M.moe_scenario_defaults(), **shape}
    seed, steps = knobs.pop("seed", 0), knobs.pop("steps", None)
    if workload == "burst":  # its burst is the last of every burst_every steps: a mean needs them all
        every = knobs.get("burst_every", registry()["moe"].params["burst_every"].default)
        steps = every if steps is None else steps
        if steps < every:
            raise UsageError(f"--workload burst: steps={steps} never reaches the burst step (the last of "
                             f"burst_every={every}); set --param moe.steps={every}")
    steps = 1 if steps is None else steps
    if "tokens_by_rank" in knobs and "tokens" not in shape:  # the listed tokens set the nominal: their mean
        try:
            listed = parse_tokens_by_rank(knobs["tokens_by_rank"])
        except ValueError as e:
            raise UsageError(f"--workload {workload}: {e}") from None
        shape["tokens"] = full["tokens"] = max(1, round(sum(listed) / len(listed)))
    skew = lru_cache(None)(lambda p, G: MS.workload_skew(workload, full["experts"], full["topk"], p, full["tokens"],
                                                         seed=seed, steps=steps, G=G, **knobs))
    fits = [p for p in worlds if full["experts"] % p == 0 and p > 1]
    if fits:
        try:
            skew(fits[0], fits[0])
        except ValueError as e:
            raise UsageError(f"--workload {workload}: {e}") from None
    return skew
