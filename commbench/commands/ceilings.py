"""`commbench ceilings`: the hardware profiles, with the flags' overrides, as one table."""
from __future__ import annotations

from commbench.analyse import ceilings
from commbench.report.model_view import profiles_table
from commbench.report.terminal import make_console, stdout_is_tty


def ceilings_command(profiles_of) -> int:
    """Print the profiles (profiles_of(default names) gives them with the flags' overrides)."""
    rows = ceilings.profiles_table_rows(profiles_of(ceilings.list_profiles()))
    make_console().print(profiles_table(rows, plain=not stdout_is_tty()))
    return 0
