"""What a MoE exchange sent beside the rows its routing needed carried: the low-latency
mode's routed_nbytes, sent_nbytes and their ratio (moe/accounting.py) as table cells, a
table note and summary words, so that a rate over routed bytes is never read as the wire's."""
from __future__ import annotations

from commbench.core.schema import has
from commbench.report.fmt import fmt


def bytes_as_sent(r: dict) -> tuple[float, float, float] | None:
    """(routed bytes, sent bytes, sent / routed) of a row whose exchange says what it sent
    (the low-latency mode's routed_nbytes, sent_nbytes; rows written before those fields:
    useful_sent_nbytes, padded_sent_nbytes); None for any other row."""
    for routed_k, sent_k in (("routed_nbytes", "sent_nbytes"), ("useful_sent_nbytes", "padded_sent_nbytes")):
        routed, sent = r.get(routed_k), r.get(sent_k)
        if has(routed) and has(sent) and float(routed) > 0:
            return float(routed), float(sent), float(sent) / float(routed)
    return None


def padding_cell(r: dict) -> str:
    b = bytes_as_sent(r)
    return f"{b[2]:.2f}x" if b else "-"


def mb_cell(r: dict, i: int) -> str:
    b = bytes_as_sent(r)
    return fmt(b[i] / 1e6, 2) if b else "-"


def sent_words(rs: list[dict]) -> str:
    """What the exchange sent beside the routed rows, at the point that padded the most:
    both rates, so a % of line rate over routed bytes is never read as the wire's."""
    got = [(r, bytes_as_sent(r)) for r in rs]
    got = [(r, b) for r, b in got if b and float(r.get("time_us_p50") or 0) > 0]
    if not got:
        return ""
    r, (routed, sent, factor) = max(got, key=lambda rb: rb[1][2])
    t_s = float(r["time_us_p50"]) * 1e-6
    return (f"; the exchange sends {factor:.2f}x the routed bytes ({fmt(sent / t_s / 1e9)} GB/s sent, "
            f"{fmt(routed / t_s / 1e9)} GB/s routed, a rank's rows to itself included)")


# Said under a table whose rows say what their exchange sent (the low-latency mode).
SENT_NOTE = ("; routed / sent (MB): the routed rows' bytes and the bytes the exchange sends, of the rank that sends "
             "the most (its own rows included; a low-latency dispatch's count headers count as sent); sent/routed: "
             "their ratio, the padding (1.00x: only the routed rows travel); MB = 1e6 B")
