"""`commbench model`: the what-if model's projections on hardware profiles (or on a fabric
calibrated from a measured run), or the model held against its table of published figures
(--against). The numbers are analyse.model's; the tables report/model_view.py's."""
from __future__ import annotations

from commbench.analyse import ceilings
from commbench.analyse import model as M
from commbench.analyse.analysis import fit_table
from commbench.analyse.model_check import check, default_table, load_table, summary
from commbench.core.errors import UsageError
from commbench.core.units import parse_sizes_arg, sweep_sizes
from commbench.moe import accounting
from commbench.report.model_view import (
    against_table,
    assumptions_text,
    fabric_title,
    left_out_lines,
    nccl_pick_line,
    projection_table,
    summary_lines,
)
from commbench.report.terminal import make_console, stdout_is_tty
from commbench.store.load import load
from commbench.store.results import load_meta


def cmd_against(path, console, plain: bool) -> int:
    """Print the table and the summary; exit status 0 when the held-out rows pass, else 1 (also
    when no row is held out: nothing was tested)."""
    source = path or default_table()
    checked = check(load_table(source))
    console.print(against_table(checked, source, plain))
    for line in summary_lines(summary(checked)):
        console.print(line)
    return 0 if summary(checked)["ok"] else 1


def model_command(args, profiles_of) -> int:
    """Projections on the profiles (profiles_of(default names)), or the model against its
    table of published figures (--against)."""
    console = make_console()
    plain = not stdout_is_tty()
    if args.against is not None:
        # each row of the table names its own profile, world, size and shape
        given = [f"--{k.replace('_', '-')}" for k in ("profile", "worlds", "sizes", "algos", "calibrate", "tokens",
                                                      "hidden", "experts", "topk", "max_groups", "nic_gbps",
                                                      "scaleup_GBps", "domain_gpus")
                 if getattr(args, k, None) is not None] + (["--rate"] if args.rate != "achieved" else [])
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
    shape = _moe_shape(args)
    console.print(assumptions_text(M.ASSUMPTIONS))
    for name, fab in fabrics:
        skipped: list = []
        rows = M.project(args.kind, worlds, fab, sizes_nbytes=sizes, moe_shape=shape, algos=args.algos,
                         skipped=skipped)
        console.print(projection_table(args.kind, fabric_title(name, args.rate, fab), rows, plain))
        if args.kind == "all_reduce":  # what NCCL itself would run there, and why
            for p in worlds:
                for S in sizes:
                    console.print(nccl_pick_line(p, S, M.nccl_pick(p, S, fab)))
        for line in left_out_lines(skipped):
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
