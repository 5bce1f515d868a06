"""`commbench model` and `commbench ceilings` as a person reads them: the projections'
tables, the published figures beside the model's projections with their summary lines,
and the hardware profiles' table. The numbers are analyse.model's and
analyse.model_check's; the flows are commands/model.py and commands/ceilings.py."""
from __future__ import annotations

from rich import box
from rich.table import Table

from commbench.analyse.collectives import nccl_channels_across
from commbench.analyse.model_check import BOUND_RATIO, CLOSE_RATIO, HELD_SHARE, MEDIAN_BAND, within
from commbench.core.units import fmt_size


def _class_name(k: tuple[str, str]) -> str:
    return f"MoE stack {k[1]}" if k[0] == "moe" else f"{k[0]} / {k[1]}"


def _pct(n: int, N: int) -> str:
    """n of N as a percentage, floored to one decimal below 100: 178 of 198 reads 89.8, not a
    rounded 90 beside a verdict that says it is under 90."""
    return f"{int(1000 * n / N) / 10:g}"


def summary_lines(s: dict) -> list[str]:
    """The counts, the per-group medians (not judged), and the verdict: the share of held-out rows
    within BOUND_RATIO and every class's median (model_check.summary), each failing class named."""
    lo, hi = MEDIAN_BAND
    n, N = s["held_within"]
    lines = [f"held-out within {BOUND_RATIO}x (time ratio {1 / BOUND_RATIO:.2f}-{BOUND_RATIO}): {n} of {N}"
             + (f" ({_pct(n, N)} %; the verdict wants {100 * HELD_SHARE:.0f} %)" if N else ""),
             f"held-out within {CLOSE_RATIO}x: {s['held_close'][0]} of {s['held_close'][1]}",
             f"all rows (fit included) within {BOUND_RATIO}x: {s['all_within'][0]} of {s['all_within'][1]}"]
    for g, m in s["medians"].items():
        lines.append(f"median ratio, {g} (held-out, all fabrics; the verdict judges each class): {m:.2f}")
    if not s["held_within"][1]:  # every row set a rate or term: nothing was left to test the model
        lines[0] = "held-out: none (every row is use = \"fit\": it set a rate or term of the model)"
        del lines[1]  # no held-out row to count within 1.25x
        lines.append("verdict: nothing to judge: no figure is held out, so the table cannot test the model "
                     "(add rows with use = \"held-out\")")
        return lines
    judged = len(s["classes"])
    if s["ok"]:
        verdict = (f"the model agrees with the held-out figures ({n} of {N} within {BOUND_RATIO}x, at least "
                   f"{100 * HELD_SHARE:.0f} %; each of the {judged} classes has held-out rows and its median "
                   f"within {lo}-{hi})")
    else:
        why = [f"{_pct(n, N)} % within {BOUND_RATIO}x, under {100 * HELD_SHARE:.0f} %"] if n < HELD_SHARE * N else []
        why += [f"{_class_name(k)}: {m}" for k, m in s["class_misses"].items()]
        verdict = "the model misses: " + "; ".join(why)
    lines.append("verdict: " + verdict + " (ratio = projected / published time; below 1 the model is too fast)")
    if s["absent"]:
        lines.append("classes with no published figure in this table (not judged): "
                     + ", ".join(_class_name(k) for k in s["absent"]))
    return lines


def class_lines(classes: dict) -> list[str]:
    """One line a class (collective x tier x fabric, or a MoE stack: model_check.class_summary)."""
    lo, hi = MEDIAN_BAND
    lines = []
    for k, v in classes.items():
        if v["held"]:
            ok = "within" if lo <= v["median"] <= hi else "OUTSIDE"
            held = (f"held-out {v['held']}: within {BOUND_RATIO}x {v['within']}, within {CLOSE_RATIO}x {v['close']}, "
                    f"median {v['median']:.2f} {ok} {lo}-{hi}")
        else:
            held = "held-out 0: NO HELD-OUT ROW (the verdict fails it)"
        lines.append(f"class {_class_name(k)}: fit {v['fit']}, {held}")
    return lines


def against_table(checked: list[dict], source, plain: bool) -> Table:
    """The published figures of `source` beside the model's projections (checked rows)."""
    t = Table(title=f"the what-if model against published figures ({source})",
              box=box.ASCII if plain else box.SIMPLE_HEAD)
    for c in ("id", "use", "profile", "world", "size", "measure", "published", "projected", "ratio", "NCCL / case",
              "bound"):
        t.add_column(c, justify="right" if c in ("world", "size", "published", "projected", "ratio") else "left")
    for c in checked:
        size = fmt_size(c["nbytes"]) if "nbytes" in c else f"{c['tokens']} tok {c['stage']}"
        if c["kind"] not in ("all_reduce", "moe"):
            size += f" {c['kind']}"
        mark = "" if within(c["ratio"]) else " !"
        t.add_row(c["id"], c["use"], c["profile"], str(c["world"]), size, c["measure"], f"{c['published']:.4g}",
                  f"{c['projected']:.4g}", f"{c['ratio']:.2f}{mark}", str(c["algorithm_modelled"]), c["bound"])
    return t


def profiles_table(rows: list[dict], plain: bool) -> Table:
    """`commbench ceilings`: one row per hardware profile (ceilings.profiles_table_rows)."""
    t = Table(title="hardware profiles", box=box.ASCII if plain else box.SIMPLE_HEAD,
              caption="GB/s = 1e9 bytes/s PER DIRECTION (busbw compares with one direction; NVIDIA's 900 GB/s and "
                      "1.8 TB/s NVLink figures are both directions summed); NIC Gb/s = gigabits per direction "
                      "(800 Gb/s = 100 GB/s); HBM is total. line = physical rate, achieved = what a tuned stack "
                      "typically reaches. loopback is measured at the start of each run (meta.json 'ceilings').")
    for c in rows[0]:
        t.add_column(c, justify="left" if c in ("profile", "scale-up link", "domain", "NIC") else "right")
    for r in rows:
        t.add_row(*r.values())
    return t


def assumptions_text(assumptions) -> str:
    return "assumptions:\n" + "\n".join(f"  - {a}" for a in assumptions)


def fabric_title(name: str, rate: str, fab) -> str:
    """One fabric in a line: its tiers' rates and alphas, the title of its projection table."""
    up, out = fab.scaleup, fab.scaleout
    return (f"{name} ({rate} rates): scale-up {up.bandwidth_gbps:.4g} GB/s/dir alpha {up.alpha_us:.3g} us, "
            f"G={fab.domain_gpus or 'one host'}" + (f"; scale-out {out.bandwidth_gbps:.4g} GB/s/dir alpha "
                                                    f"{out.alpha_us:.3g} us" if out else "; no scale-out tier")
            + _nccl_terms(fab.terms) + _channels(fab))


def _channels(fab) -> str:
    """Where the model knows NCCL's channels across nodes, how many: its per-channel ceilings
    and ring plateau rest on them (docs/model.md#latency-and-protocols)."""
    ch = nccl_channels_across(fab)
    return f", {ch} NCCL channels across nodes (its graph search; per-channel ceilings)" if ch else ""


def _nccl_terms(t) -> str:
    """A NCCL fabric's latency terms (docs/model.md#latency-and-protocols), '' for alpha-beta."""
    if t.gpu_arch is None:
        return ""
    return (f"; collectives at NCCL's {t.gpu_arch} latencies, network +{t.net_latency_us:.3g} us a step"
            + (f" (+{t.net_simple_latency_us:.3g} more for Simple)" if t.net_simple_latency_us is not None else "")
            + (f", +{t.net_fixed_us:.3g} us once across" if t.net_fixed_us else "")
            + (f", protocols {'/'.join(t.net_protocols)} across" if t.net_protocols else "")
            + (f", NIC ramp {t.net_ramp_nbytes_per_gpu / (1 << 20):.3g} MiB a GPU" if t.net_ramp_nbytes_per_gpu else ""))


def projection_table(kind: str, title: str, rows: list[dict], plain: bool) -> Table:
    """The model's projections of one fabric (analyse.model.project's rows)."""
    t = Table(title=title, box=box.ASCII if plain else box.SIMPLE_HEAD)
    # placement: how the world sits on the domains (2 x 64/72: two racks, 64 of 72 GPUs each).
    if kind == "moe":
        # routing and skew only when a workload or trace adds skewed rows beside the uniform ones
        skewed = any(r.get("routing", "uniform") != "uniform" for r in rows)
        cols = ("world", "placement", "dispatcher (case)") + (("routing", "skew") if skewed else ()) + (
            "NIC copies/token", "NVLink copies/token", "dispatch (us)", "combine (us)", "bottleneck")
        for c in cols:
            t.add_column(c, justify="left" if c in ("dispatcher (case)", "routing", "bottleneck", "placement")
                         else "right")
        for r in rows:
            t.add_row(str(r["world"]), str(r.get("placement", "")), moe_case_cell(r),
                      *((r["routing"], skew_cell(r)) if skewed else ()), f"{r['nic_copies_per_token']:.3f}",
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
    return t


def nccl_pick_line(world: int, nbytes: int, pick: dict) -> str:
    """What NCCL itself would run at one world and size, and why (analyse.model.nccl_pick)."""
    return f"NCCL would pick at world {world}, {fmt_size(nbytes)}: {pick['nccl']} {pick['time_us']:.4g} us: {pick['why']}"


def moe_case_cell(r: dict) -> str:
    """A MoE row's dispatcher as the benchmark names it, with the byte accounting's case."""
    d, c = r.get("dispatcher"), r.get("case") or ""
    return f"{d} ({c})" if d and d != c else c


def skew_cell(r: dict) -> str:
    """A MoE row's skew: one factor, or NVLink's and the NIC's where they differ."""
    nvl, nic = r.get("nvl_skew", r.get("skew", 1.0)), r.get("nic_skew")
    return f"x{nvl:.2f}" if nic is None or abs(nic - nvl) < 5e-3 else f"x{nvl:.2f} NVL, x{nic:.2f} NIC"


def skew_lines(rows: list[dict]) -> list[str]:
    """What each world's skewed rows rest on, one line a world (model_skew's basis)."""
    said: dict = {}
    for r in rows:
        if r.get("skew_basis"):
            said.setdefault(r["world"], f"skew at world {r['world']}: {r['skew_basis']}; each tier's bandwidth "
                                        "term x its skew, latency unchanged")
    return list(said.values())


def left_out_lines(skipped: list[dict]) -> list[str]:
    """Every case the model left out, with its reason, each said once: never silently."""
    said: list[str] = []
    for sk in skipped:
        what = f" {moe_case_cell(sk)}" if sk.get("case") else ""
        line = f"left out: world {sk['world']}{what}: {sk['reason']}"
        if line not in said:
            said.append(line)
    return said
