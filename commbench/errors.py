"""Errors that end a run with one line and a known exit status."""


class UsageError(Exception):
    """Bad input (suite file, CLI flag, impossible sweep): one line, exit status 2."""

    exit_status = 2
