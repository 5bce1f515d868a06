"""Reading runs as a table: load() gives one pandas DataFrame over one or many result
directories (rows migrated, rows that cannot be left out and said, params a dict and a
column per parameter too)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path, PurePath

from commbench.core.errors import UsageError
from commbench.core.schema import ROW_KEY, params_dict, time_cannot_be
from commbench.store.results import read_rows_checked


def _rows_file(p: Path) -> Path:
    p = Path(p)
    if p.is_dir():
        p = p / "rows.jsonl"
    if not p.is_file():
        raise UsageError(f"{p}: no rows.jsonl (not a commbench result directory)")
    return p


def run_names(dirs) -> list[str]:
    """Each run directory's name: its own name ("quick"), or, where two runs share it, the
    shortest end of its path that tells it from the others ("x1/quick", "y1/quick"). dirs:
    absolute paths. The same directory given twice cannot be told apart: both keep the name
    that tells them from the rest."""
    parts = [PurePath(d).parts[1:] if PurePath(d).anchor else PurePath(d).parts for d in dirs]
    names = []
    for i, p in enumerate(parts):
        others = [q for j, q in enumerate(parts) if j != i and q != p]
        k = 1
        while k < len(p) and any(q[-k:] == p[-k:] for q in others):
            k += 1
        names.append("/".join(p[-k:]))
    return names


def names_for(paths) -> list[str]:
    """The `run` name load() gives the rows of each path (a run directory or its rows.jsonl)."""
    return run_names([os.path.abspath(p if Path(p).is_dir() else Path(p).parent) for p in paths])


def load(paths, warn=None):
    """One pandas DataFrame for one run directory (or rows.jsonl) or a list of them; a
    `run` column names the directory each row came from (run_names: "quick", or "x1/quick"
    and "y1/quick" where two directories share a name); `params` is a dict in every row,
    and each parameter a column of its own too, named <benchmark>.<param> (`moe.tokens`,
    `moe.copies`; flatten_params), so groupby and pivot work on it.

    A file with lines but no row in it is refused (a text file is not a run); lines that are
    not rows, and rows that appear more than once in one run (the same point and stage, ROW_KEY:
    two writers, a resume that raced a running run), are said through warn(line) -- stderr by
    default -- never hidden."""
    import pandas as pd

    warn = warn or (lambda line: print(f"warning: {line}", file=sys.stderr, flush=True))
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files = [_rows_file(Path(p)) for p in paths]
    frames = []
    for f, name in zip(files, names_for(files)):
        rows, bad = read_rows_checked(f)
        if bad and not rows:
            raise UsageError(f"{f}:{bad[0]}: not a commbench row (no rows in this file)")
        if bad:
            warn(f"{f}: {len(bad)} line(s) are not rows and were skipped (line {bad[0]} first)")
        impossible = [r for r in rows if time_cannot_be(r)]
        if impossible:
            r = impossible[0]
            what = (f"{r.get('benchmark')} {r.get('nbytes')} B {r.get('dtype')} world {r.get('world')} "
                    f"time_us_p50 {r.get('time_us_p50')!r}")
            if len(impossible) == len(rows):
                raise UsageError(f"{f}: every row holds a time_us_p50 that cannot be (0, negative, NaN or inf), "
                                 f"as {what}: nothing to read")
            warn(f"{f}: {len(impossible)} row(s) hold a time_us_p50 that cannot be (0, negative, NaN or inf) "
                 f"and were left out ({what} first)")
            rows = [r for r in rows if not time_cannot_be(r)]
        # A point's stages (moe's dispatch and combine) are rows of one point key.
        keys = [(r.get("point_key"), r.get("stage")) for r in rows]
        dup = len(keys) - len(set(keys))
        if dup:
            warn(f"{f}: {dup} point(s) appear more than once (rows of the same point_key and stage)")
        df = pd.DataFrame(rows)
        df["run"] = name
        frames.append(df)
    return flatten_params(pd.concat(frames, ignore_index=True)) if frames else pd.DataFrame()


def flatten_params(df):
    """df with a column <benchmark>.<param> for every parameter of its rows' params (a
    dict column cannot be grouped on: dicts are unhashable); rows of another benchmark, or
    without that parameter, hold NaN there. The params column stays as it is."""
    import pandas as pd

    if df.empty or "params" not in df.columns or "benchmark" not in df.columns:
        return df
    cols: dict[str, dict] = {}
    for i, (bench, params) in enumerate(zip(df["benchmark"], df["params"])):
        for k, v in params_dict(params).items():
            # A list or dict value would be unhashable again: its canonical JSON instead.
            cols.setdefault(f"{bench}.{k}", {})[i] = json.dumps(v, sort_keys=True) if isinstance(v, (list, dict)) else v
    new = {c: pd.Series(vals, dtype=object).reindex(range(len(df))) for c, vals in sorted(cols.items())
           if c not in df.columns}
    if not new:
        return df
    flat = pd.DataFrame(new, index=range(len(df))).infer_objects()
    return pd.concat([df.reset_index(drop=True), flat], axis=1)


def refuse_duplicates(df) -> None:
    """A point twice in one run (two writers, or a resume that raced a running run) has no
    one time to compare: say which, rather than guess. Repeated runs on one side are fine."""

    if df.empty or "point_key" not in df.columns:
        return
    dup = df[df.duplicated(["run", *ROW_KEY], keep=False)]
    if len(dup):
        r = dup.iloc[0]
        raise UsageError(f"run {r['run']} holds point {r['point_key']} ({r['stage'] or 'one stage'}) more than once: "
                         f"compare will not guess which to use")


def load_side(paths, name: str):
    """The rows of one side's runs, each run named by its directory (by the path as given
    when two directories of one side share a name, as a/quick and b/quick). The repeats of a
    `--repeat N` run keep their `repeat` column: compare.fold_repeats decides what they are."""
    from pathlib import Path

    import pandas as pd


    if not paths:
        raise UsageError(f"no run given for the {name} side")
    seen = {}
    for p in paths:
        q = Path(p).resolve()
        q = q.parent if q.name == "rows.jsonl" else q
        if q in seen:
            raise UsageError(f"{p}: given twice for the {name} side (the same run twice is not a repeat)")
        seen[q] = p
    frames = [load(p) for p in paths]
    names = [str(f["run"].iloc[0]) if len(f) else Path(p).name for f, p in zip(frames, paths)]
    clash = {x for x in names if names.count(x) > 1}
    for f, p, x in zip(frames, paths, names):
        f["run"] = str(p) if x in clash else x
    return pd.concat(frames, ignore_index=True)
