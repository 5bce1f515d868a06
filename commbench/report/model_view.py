"""`commbench model --against`: the published figures beside the model's projections, one
table and its summary lines (the numbers are analyse.model_check's)."""
from __future__ import annotations

from rich import box
from rich.table import Table

from commbench.analyse.model_check import BOUND_RATIO, MEDIAN_BAND, check, default_table, load_table, summary, within
from commbench.core.units import fmt_size


def summary_lines(s: dict) -> list[str]:
    lo, hi = MEDIAN_BAND
    lines = [f"held-out within {BOUND_RATIO}x (time ratio {1 / BOUND_RATIO:.2f}-{BOUND_RATIO}): "
             f"{s['held_within'][0]} of {s['held_within'][1]}",
             f"all rows (fit included) within {BOUND_RATIO}x: {s['all_within'][0]} of {s['all_within'][1]}"]
    for g, m in s["medians"].items():
        lines.append(f"median ratio, {g} (held-out): {m:.2f}  "
                     + ("within" if s["medians_ok"][g] else "OUTSIDE") + f" {lo}-{hi}")
    lines.append("verdict: " + ("the model agrees with every held-out figure" if s["ok"] else
                                "the model misses: see the rows and medians above")
                 + " (ratio = projected / published time; below 1 the model is too fast)")
    return lines


def cmd_against(path, console, plain: bool) -> int:
    """Print the table and the summary; exit status 0 when the held-out rows pass, else 1."""
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
