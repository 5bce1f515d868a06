"""`commbench model --against`: the published figures beside the model's projections, one
table and its summary lines (the numbers are analyse.model_check's)."""
from __future__ import annotations

from rich import box
from rich.table import Table

from commbench.analyse import ceilings
from commbench.analyse import model as M
from commbench.analyse.analysis import fit_table
from commbench.analyse.model_check import BOUND_RATIO, MEDIAN_BAND, check, default_table, load_table, summary, within
from commbench.core.errors import UsageError
from commbench.core.units import fmt_size, parse_size
from commbench.moe import accounting
from commbench.report.terminal import make_console, stdout_is_tty
from commbench.store.load import load
from commbench.store.results import load_meta


def summary_lines(s: dict) -> list[str]:
    lo, hi = MEDIAN_BAND
    lines = [f"held-out within {BOUND_RATIO}x (time ratio {1 / BOUND_RATIO:.2f}-{BOUND_RATIO}): "
             f"{s['held_within'][0]} of {s['held_within'][1]}",
             f"all rows (fit included) within {BOUND_RATIO}x: {s['all_within'][0]} of {s['all_within'][1]}"]
    for g, m in s["medians"].items():
        lines.append(f"median ratio, {g} (held-out): {m:.2f}  "
                     + ("within" if s["medians_ok"][g] else "OUTSIDE") + f" {lo}-{hi}")
    if not s["held_within"][1]:  # every row set a rate or term: nothing was left to test the model
        lines[0] = "held-out: none (every row is use = \"fit\": it set a rate or term of the model)"
        lines.append("verdict: nothing to judge: no figure is held out, so the table cannot test the model "
                     "(add rows with use = \"held-out\")")
        return lines
    lines.append("verdict: " + ("the model agrees with every held-out figure" if s["ok"] else
                                "the model misses: see the rows and medians above")
                 + " (ratio = projected / published time; below 1 the model is too fast)")
    return lines


def cmd_against(path, console, plain: bool) -> int:
    """Print the table and the summary; exit status 0 when the held-out rows pass, else 1 (also
    when no row is held out: nothing was tested)."""
    rows = load_table(path or default_table())
    checked = check(rows)
    t = Table(title=f"the what-if model against published figures ({path or default_table()})",
              box=box.ASCII if plain else box.SIMPLE_HEAD)
    for c in ("id", "use", "profile", "world", "size", "measure", "published", "projected", "ratio", "NCCL / case",
              "bound"):
        t.add_column(c, justify="right" if c in ("world", "size", "published", "projected", "ratio") else "left")
    for c in checked:
        size = fmt_size(c["nbytes"]) if "nbytes" in c else f"{c['tokens']} tok {c['stage']}"
        mark = "" if within(c["ratio"]) else " !"
        t.add_row(c["id"], c["use"], c["profile"], str(c["world"]), size, c["measure"], f"{c['published']:.4g}",
                  f"{c['projected']:.4g}", f"{c['ratio']:.2f}{mark}", str(c["algorithm_modelled"]), c["bound"])
    console.print(t)
    for line in summary_lines(summary(checked)):
        console.print(line)
    return 0 if summary(checked)["ok"] else 1


def ceilings_command(profiles_of) -> int:
    """`commbench ceilings`: the hardware profiles (profiles_of(default names) gives them with
    the flags' overrides)."""
    rows = ceilings.profiles_table_rows(profiles_of(ceilings.list_profiles()))
    t = Table(title="hardware profiles", box=box.ASCII if not stdout_is_tty() else box.SIMPLE_HEAD,
              caption="GB/s = 1e9 bytes/s PER DIRECTION (busbw compares with one direction; NVIDIA's 900 GB/s and "
                      "1.8 TB/s NVLink figures are both directions summed); NIC Gb/s = gigabits per direction "
                      "(800 Gb/s = 100 GB/s); HBM is total. line = physical rate, achieved = what a tuned stack "
                      "typically reaches. loopback is measured at the start of each run (meta.json 'ceilings').")
    for c in rows[0]:
        t.add_column(c, justify="left" if c in ("profile", "scale-up link", "domain", "NIC") else "right")
    for r in rows:
        t.add_row(*r.values())
    make_console().print(t)
    return 0


def model_command(args, profiles_of) -> int:
    """`commbench model`: projections on the profiles (profiles_of(default names)), or the
    model against its table of published figures (--against)."""
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
    sizes = [parse_size(x.strip()) for x in (args.sizes or "1M,64M,1G").split(",") if x.strip()]
    fabrics = []
    if args.calibrate:
        meta = load_meta(args.calibrate)
        fields = ((meta.get("ceilings") or {}).get("fields")) or {}
        if not fields:
            raise UsageError(f"{args.calibrate}: meta.json has no measured profile to calibrate")
        prof = ceilings.Profile(**{k: v for k, v in fields.items() if k in ceilings.Profile.__dataclass_fields__})
        base = _fabric(M, prof, args.rate)
        fabrics.append((f"{prof.name} calibrated from {args.calibrate}", M.calibrate_fabric(fit_table(load(args.calibrate)), base)))
    else:
        for prof in profiles_of(["gb300-nvl72", "h100-hgx"]):
            if prof.measured and prof.scaleup_line_gbps is None:
                raise UsageError(f"profile {prof.name} is measured at run time: use --calibrate RUN_DIR")
            fabrics.append((prof.name, _fabric(M, prof, args.rate)))
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
    console.print("assumptions:\n" + "\n".join(f"  - {a}" for a in M.ASSUMPTIONS))
    for name, fab in fabrics:
        up, out = fab.scaleup, fab.scaleout
        desc = (f"{name} ({args.rate} rates): scale-up {up.bandwidth_gbps:.4g} GB/s/dir alpha {up.alpha_us:.3g} us, "
                f"G={fab.domain_gpus or 'one host'}" + (f"; scale-out {out.bandwidth_gbps:.4g} GB/s/dir alpha "
                                                        f"{out.alpha_us:.3g} us" if out else "; no scale-out tier"))
        skipped: list = []
        rows = M.project(args.kind, worlds, fab, sizes_nbytes=sizes, moe_shape=shape, algos=args.algos,
                         skipped=skipped)
        t = Table(title=desc, box=box.ASCII if plain else box.SIMPLE_HEAD)
        # placement: how the world sits on the domains (2 x 64/72: two racks, 64 of 72 GPUs each).
        if args.kind == "moe":
            cols = ("world", "placement", "case", "NIC copies/token", "NVLink copies/token", "dispatch (us)",
                    "combine (us)", "bottleneck")
            for c in cols:
                t.add_column(c, justify="left" if c in ("case", "bottleneck", "placement") else "right")
            for r in rows:
                t.add_row(str(r["world"]), str(r.get("placement", "")), r["case"], f"{r['nic_copies_per_token']:.3f}",
                          f"{r['nvl_copies_per_token']:.3f}", f"{r['dispatch_us']:.1f}", f"{r['combine_us']:.1f}",
                          f"{r['dispatch_bottleneck']} ({r['dispatch_bound']})")
        else:
            for c in ("world", "placement", "size", "algorithm", "NCCL name", "time (us)", "algbw (GB/s)",
                      "busbw (GB/s)", "bound"):
                t.add_column(c, justify="left" if c in ("algorithm", "placement", "NCCL name", "bound") else "right")
            for r in rows:
                t.add_row(str(r["world"]), str(r.get("placement", "")), fmt_size(r["nbytes"]), r["algo"],
                          r.get("nccl", "-"), f"{r['time_us']:.2f}", f"{r['algbw_gbps']:.2f}",
                          f"{r['busbw_gbps']:.2f}", r.get("bound", ""))
        console.print(t)
        if args.kind == "all_reduce":  # what NCCL itself would run there, and why
            for p in worlds:
                for S in sizes:
                    pick = M.nccl_pick(p, S, fab)
                    console.print(f"NCCL would pick at world {p}, {fmt_size(S)}: {pick['nccl']} "
                                  f"{pick['time_us']:.4g} us: {pick['why']}")
        said = set()
        for sk in skipped:  # every case left out, with the model's reason, never silently
            line = f"left out: world {sk['world']} {sk.get('case') or ''}: {sk['reason']}".replace("  ", " ")
            if line not in said:
                said.add(line)
                console.print(line)
    return 0


def _fabric(M, prof, rate: str):
    return M.fabric_from_profile(prof, rate)
