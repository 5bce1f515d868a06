"""The text forms of a routing trace (trace.py reads the arrays): JSONL, an optional header
line then one object per token, and CSV, optional `# key=value` lines then one row per token.
Each reader returns (topk, weights or None, header) for trace.py to check as it checks an
array; anything it cannot take is one ValueError line naming the line of the file."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

HEADER_KEYS = ("num_experts", "ep_size")


def _header_int(header: dict, key: str, where: str) -> int | None:
    v = header.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{where}: {key} must be an integer >= 1, got {v!r}")
    return v


def _int_ids(values, where: str) -> list[int]:
    if not isinstance(values, list) or not values:
        raise ValueError(f"{where}: experts must be a non-empty list, got {values!r}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{where}: expert id {v!r} is not an integer")
    return values


def _weights(values, where: str) -> list[float]:
    if not isinstance(values, list):
        raise ValueError(f"{where}: weights must be a list, got {values!r}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{where}: weight {v!r} is not a number")
    return [float(v) for v in values]


def _step(v, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{where}: step must be an integer >= 0, got {v!r}")
    return v


def _assemble(tokens: list[tuple[int, list[int], list[float] | None]], where: str):
    """Per-token (step, ids, weights) in file order -> [steps, tokens, topk] arrays."""
    if not tokens:
        raise ValueError(f"{where}: empty trace (no tokens)")
    k = len(tokens[0][1])
    has_w = tokens[0][2] is not None
    for i, (_, ids, w) in enumerate(tokens):
        if len(ids) != k:
            raise ValueError(f"{where}: token {i} has {len(ids)} experts, token 0 has {k} (ragged top-k)")
        if (w is not None) != has_w:
            raise ValueError(f"{where}: token {i} {'has' if w is not None else 'lacks'} weights, token 0 "
                             f"{'has' if has_w else 'does not'}")
        if w is not None and len(w) != k:
            raise ValueError(f"{where}: token {i} has {len(w)} weights for {k} experts")
    groups: dict[int, list] = {}
    for t in tokens:
        groups.setdefault(t[0], []).append(t)
    steps = sorted(groups)
    if steps != list(range(len(steps))):
        raise ValueError(f"{where}: steps must be 0, 1, ... with none missing, got {steps[:5]}...")
    by_step = [groups[s] for s in steps]
    counts = {len(b) for b in by_step}
    if len(counts) > 1:
        raise ValueError(f"{where}: steps have different token counts ({min(counts)} to {max(counts)})")
    try:
        topk = np.array([[ids for _, ids, _ in b] for b in by_step], dtype=np.int64)
    except OverflowError:
        raise ValueError(f"{where}: an expert id does not fit in 64 bits") from None
    weights = np.array([[w for _, _, w in b] for b in by_step], dtype=np.float64) if has_w else None
    return topk, weights


def read_jsonl(path: Path, where: str, max_nbytes: int):
    header, tokens = {}, []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            at = f"{where}: line {n}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{at}: not JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{at}: not a JSON object")
            if "experts" not in obj:
                if tokens or header:
                    raise ValueError(f"{at}: no 'experts' (only the first line may be a header)")
                unknown = sorted(set(obj) - set(HEADER_KEYS))
                if unknown:
                    raise ValueError(f"{at}: unknown header key {unknown[0]!r} (known: {', '.join(HEADER_KEYS)})")
                header = {k: _header_int(obj, k, at) for k in HEADER_KEYS if k in obj}
                continue
            unknown = sorted(set(obj) - {"step", "experts", "weights"})
            if unknown:
                raise ValueError(f"{at}: unknown key {unknown[0]!r} (known: step, experts, weights)")
            w = obj.get("weights")
            tokens.append((_step(obj.get("step", 0), at), _int_ids(obj["experts"], at),
                           None if w is None else _weights(w, at)))
    return *_assemble(tokens, where), header


def _numbers(text: str, kind, at: str, what: str) -> list:
    out = []
    for word in text.split():
        try:
            out.append(kind(word))
        except ValueError:
            raise ValueError(f"{at}: {what} {word!r} is not {'an integer' if kind is int else 'a number'}") from None
    return out


def read_csv(path: Path, where: str, max_nbytes: int):
    tokens, header = [], {}
    with open(path, encoding="utf-8", newline="") as f:
        line = f.readline()
        while line.startswith("#"):  # "# num_experts=E ep_size=P" before the column names
            for word in line[1:].split():
                key, _, value = word.partition("=")
                if key not in HEADER_KEYS:
                    raise ValueError(f"{where}: unknown header key {key!r} (known: {', '.join(HEADER_KEYS)})")
                header[key] = _header_int({key: _numbers(value, int, where, key)[0] if value else None}, key, where)
            line = f.readline()
        rows = csv.reader(f)
        head = [h.strip() for h in next(csv.reader([line]), [])]
        if "experts" not in head or not set(head) <= {"step", "experts", "weights"}:
            raise ValueError(f"{where}: the header must be step,experts[,weights], got {','.join(head)!r}")
        col = {h: i for i, h in enumerate(head)}
        for n, row in enumerate(rows, 2):
            if not any(c.strip() for c in row):
                continue
            at = f"{where}: line {n}"
            if len(row) != len(head):
                raise ValueError(f"{at}: {len(row)} fields, the header has {len(head)}")
            step = _numbers(row[col["step"]], int, at, "step") if "step" in col else [0]
            if len(step) != 1:
                raise ValueError(f"{at}: step must be one integer")
            ids = _numbers(row[col["experts"]], int, at, "expert id")
            w = _numbers(row[col["weights"]], float, at, "weight") if "weights" in col else None
            tokens.append((_step(step[0], at), _int_ids(ids, at), w))
    return *_assemble(tokens, where), header
