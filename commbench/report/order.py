"""Which of a point's params vary among rows, and the order rows are shown in."""
from __future__ import annotations

import json

from commbench.core.schema import params_dict


def varying_params(values) -> list[str]:
    """The parameter names that take two or more values across a column of params (dicts
    or canonical JSON); a name some rows lack but that is constant where present does not
    count."""
    dicts = [params_dict(v) for v in values]
    names = sorted({k for p in dicts for k in p})
    return [k for k in names if len({json.dumps(p[k], sort_keys=True) for p in dicts if k in p}) > 1]


def params_order(params, declared=()) -> tuple:
    """A sort key of a point's params (a dict or canonical JSON): the values of the
    `declared` names first, in that order (a benchmark's Benchmark.params: routing before
    its skew), then the rest by name; numbers by value (alpha 0.5 before 1.0 before 10),
    text by name."""
    p = params_dict(params)
    keys = [k for k in declared if k in p] + sorted(k for k in p if k not in declared)
    return tuple((0, float(p[k]), "") if isinstance(p[k], (int, float)) and not isinstance(p[k], bool)
                 else (1, 0.0, str(p[k])) for k in keys)
