"""Rows judged again against another hardware profile (`commbench report --profile`): every
row's ceiling fields recomputed, with the node map each run recorded."""
from __future__ import annotations

from commbench.analyse.ceilings import ceiling_for_row


def rejudge_rows(df, nodes: dict, profile):
    """df with every row's ceiling fields against `profile`; nodes: run name -> the node of
    each rank (a run without one: every rank on one node)."""
    import pandas as pd

    out = []
    for r in df.to_dict("records"):
        nm = nodes.get(str(r.get("run"))) or [0] * int(r["world"])
        out.append({**r, **ceiling_for_row(profile, r, nm), "profile": profile.name})
    return pd.DataFrame(out)
