"""Rank 0's end-of-run tables made slow (COMMBENCH_SLOW_TABLES_S seconds), as printing them
is on a busy host where importing pandas and rich alone takes seconds."""
import os
import time

import commbench.report.terminal as report

_print_tables = report.print_tables


def _slow_print_tables(*args, **kwargs):
    time.sleep(float(os.environ.get("COMMBENCH_SLOW_TABLES_S") or 0))
    return _print_tables(*args, **kwargs)


report.print_tables = _slow_print_tables
