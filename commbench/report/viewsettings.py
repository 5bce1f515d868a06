"""How a person asked to see tables and warnings (`--wide`, `--style`, `--verbose`), as one
frozen value passed to whatever prints: made from the flags by the command line, and by a
rank of `run --np` from its own argv (the launcher passes its flags on), never kept in a
module global that one caller sets and another reads."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from commbench.report.styles import STYLES


@dataclass(frozen=True)
class View:
    # Every column of every table; by default the secondary columns are left out
    # (tables.WIDE), and more (tables.COMPACT) where a table would not fit.
    wide: bool = False
    # "table" (commbench's tables), or the layout of the tool the reader knows ("nccl-tests",
    # "osu"; report/styles.py) for the sized collectives' rows.
    style: str = "table"
    # Every flagged row's warning on a line of its own; by default one tally line.
    verbose: bool = False

    def __post_init__(self):
        if self.style not in STYLES:
            raise ValueError(f"unknown style {self.style!r}")


def from_flags(args) -> View:
    """The view a parsed command line asks for (a command without one of the flags: its
    default)."""
    return View(wide=bool(getattr(args, "wide", False)), style=getattr(args, "style", None) or "table",
                verbose=bool(getattr(args, "verbose", False)))


def from_argv(argv: list[str]) -> View:
    """The view a `run` command line asks for, read from its words: how a rank, which gets
    the launcher's argv, learns it. The command line was checked whole before (an unknown
    style is refused there); other flags and their values are passed over."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--wide", action="store_true")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--style", choices=STYLES, default="table")
    known, _ = p.parse_known_args(list(argv))
    return from_flags(known)
