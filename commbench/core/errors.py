"""Errors that end a run with one line and a known exit status."""


class UsageError(Exception):
    """Bad input (suite file, CLI flag, impossible sweep): one line, exit status 2."""

    exit_status = 2


class RunFailed(Exception):
    """A rank failed mid-run: its one-line cause is already printed, the run marked and the
    other ranks told; exit status 1. The original exception is the __cause__ (printed with
    its traceback when COMMBENCH_DEBUG is set)."""

    exit_status = 1
