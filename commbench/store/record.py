"""The run's record, meta.json: what the run is (suite, config, backend, hosts, versions, the
host's state, controls) and its state, the run's, each variant's and each repeat's.

RunRecord is the one writer of that state, through named transitions: a run opened, a
launch opened, a variant running / done / interrupted / skipped / failed, a repeat done,
the run ended, the launcher's settling of what a launch left. No other module writes a
status or indexes the record to change it. One rule holds whoever ends the run: a run
marked with a final status leaves no variant `running` (no rank is left to finish it).

Writers: rank 0 of a launch (opens the run, marks its variant and the run), the launcher
(variants skipped or stopped, a launch whose rank 0 could not mark the run), an import (a
record begun whole). meta.json is replaced through a temporary of a fresh name, created
exclusively and never through a link (core/safe_write), so a link planted in the run
directory is never written through."""
from __future__ import annotations

import enum
import json
import os
import signal
import socket
import time
from pathlib import Path

from commbench.core.errors import UsageError
from commbench.core.safe_write import open_nofollow, write_atomic
from commbench.core.schema import SCHEMA_VERSION
from commbench.store.provenance import captured_env, versions_here

# Blank space meta.json keeps after its JSON, for a status written on a full disk.
META_RESERVE_NBYTES = 2048


class Status(str, enum.Enum):
    """A run's (and a variant's) state in meta.json; the str value is what is written."""

    RUNNING = "running"
    COMPLETE = "complete"
    CHECK_FAILED = "check_failed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    SKIPPED = "skipped"

    def __str__(self) -> str:
        return self.value

    @property
    def finished(self) -> bool:
        """A finished run is never overwritten or resumed."""
        return self in (Status.COMPLETE, Status.CHECK_FAILED)


# Worst first: a run of several variant launches is as bad as its worst variant.
_WORST_FIRST = (Status.FAILED, Status.INTERRUPTED, Status.CHECK_FAILED, Status.RUNNING,
                Status.COMPLETE)


def overall_status(variant_meta: dict) -> Status:
    """The run's status from its variants' (skipped ones aside)."""
    states = {Status(v["status"]) for v in variant_meta.values()
              if v.get("status") in Status._value2member_map_ and v.get("status") != Status.SKIPPED}
    return next((s for s in _WORST_FIRST if s in states), Status.COMPLETE)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


# --- meta.json on disk ----------------------------------------------------------------

def read_meta_file(path) -> dict:
    """meta.json as a dict ({} when there is none); a damaged one is said in one line."""
    p = Path(path)
    try:
        meta = json.loads(p.read_text()) if p.is_file() else {}
    except ValueError as e:  # cut short by a full disk or a copy, or emptied
        what = "empty" if not p.read_bytes().strip() else f"not JSON ({e.msg}, line {e.lineno})"
        raise UsageError(f"{p}: {what}: the run's record is damaged (its rows are in rows.jsonl)") from None
    except OSError as e:
        raise UsageError(f"{p}: cannot read: {e.strerror or e}") from None
    if not isinstance(meta, dict):
        raise UsageError(f"{p}: not a commbench run's meta.json (a JSON {type(meta).__name__})")
    return meta


def write_meta_file(path, meta: dict) -> None:
    """Atomically (a temporary of a fresh name, renamed). The file is padded with trailing
    blanks (JSON allows them), so on a full disk the status can still be rewritten in
    place, in space the file already holds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(meta, indent=2, default=str) + "\n"
    data = text.encode() + b" " * META_RESERVE_NBYTES
    try:
        write_atomic(path, data)
    except OSError:
        if path.is_symlink() or not path.is_file() or path.stat().st_size < len(text):
            raise
        # Overwrite in place and blank the rest: no new blocks, and still valid JSON.
        body = text.encode()
        with os.fdopen(open_nofollow(path, os.O_RDWR), "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(0)
            f.write(body + b" " * (size - len(body)))


# --- the record -----------------------------------------------------------------------

class RunRecord:
    """meta.json of one run directory. Reading is free (`meta`, `status`, `variants`);
    every change goes through a method below. Transitions change the record in memory;
    write() puts it on disk, and the methods that end or settle a run (and the notes made
    after it ended) write it themselves."""

    def __init__(self, out_dir):
        self.dir = Path(out_dir)
        self.meta: dict = {}

    @property
    def path(self) -> Path:
        return self.dir / "meta.json"

    # --- reading ---
    def read(self) -> dict:
        self.meta = read_meta_file(self.path)
        return self.meta

    @property
    def status(self) -> str | None:
        return self.meta.get("status")

    def is_open_run(self) -> bool:
        """Whether the record holds a run (a status): a record with only a spec is one the
        launcher wrote before its ranks opened the run."""
        return "status" in self.meta

    def variants(self) -> dict:
        return {name: dict(v) for name, v in (self.meta.get("variants") or {}).items()}

    def variant_status(self, name: str) -> str | None:
        return (self.meta.get("variants") or {}).get(name, {}).get("status")

    def write(self) -> None:
        write_meta_file(self.path, self.meta)

    # --- the run's spec: written once by whoever built it, read by the ranks ---
    def write_spec(self, spec: dict) -> None:
        """meta.json's "spec" (the run as parsed), written now; the rest of the record is kept."""
        self.read()
        self.meta["spec"] = dict(spec)
        self.write()

    @staticmethod
    def read_spec(out_dir) -> dict | None:
        """The spec written in out_dir's meta.json, or None (no record, or none in it)."""
        spec = read_meta_file(Path(out_dir) / "meta.json").get("spec")
        return spec if isinstance(spec, dict) else None

    # --- opening ---
    def begin(self, fields: dict) -> None:
        """A record given whole (an import: its fields come from the files read), `running`
        until the run ends."""
        self.meta = {**fields, "status": Status.RUNNING.value}

    def open_new(self, argv: list[str], **fields) -> None:
        """A new run: where and with what it runs (the command, the host, the libraries'
        versions, the environment the libraries read) and the fields given (suite, config,
        backend, world, hosts, ...); `running`. A spec already written is kept."""
        spec = self.meta.get("spec")
        self.meta = {
            "schema": SCHEMA_VERSION,
            "command": ["commbench"] + list(argv),
            "started": _now(),
            "status": Status.RUNNING.value,
            "host": socket.gethostname(),
            "versions": versions_here(),
            "env": captured_env(),
            **fields,
        }
        if spec is not None:
            self.meta["spec"] = spec

    def reopen(self, argv: list[str], resume: bool) -> None:
        """A run that is there already, continued (resume: noted with the state it had) or
        joined by another variant or repeat: `running` again, its old reason dropped."""
        if resume:
            self.meta.setdefault("resumed", []).append({"at": _now(), "argv": argv,
                                                        "previous_status": self.meta.get("status"),
                                                        "previous_reason": self.meta.get("reason")})
        self.meta["status"] = Status.RUNNING.value
        self.meta["reason"] = None

    def add_versions(self, versions: dict) -> None:
        """What the backend says of its libraries, beside the installed versions."""
        self.meta.setdefault("versions", {}).update(versions)

    def set_host_state(self, state: dict) -> None:
        self.meta["host_state"] = dict(state)

    def set_timing_loop(self, state) -> None:
        self.meta["timing_loop"] = state

    def open_launch(self, launch_id: str, variant: str, **settings) -> None:
        """A launch into the run: from here on the state in meta.json is this launch's
        (the launch id says which), and its variant is `running` with its settings."""
        self.meta["launch"] = launch_id
        self.variant_running(variant, **settings)

    # --- variants and repeats ---
    def _variant(self, name: str) -> dict:
        return self.meta.setdefault("variants", {}).setdefault(name, {})

    def _set_variant(self, name: str, status: Status, reason: str | None = None) -> None:
        v = self._variant(name)
        v["status"] = Status(status).value
        if reason is not None:
            v["reason"] = reason

    def variant_running(self, name: str, **settings) -> None:
        """settings: the variant's env, inswitch, description. A reason it had for being
        unfinished is over: a stop from here on gives its own."""
        v = self._variant(name)
        v.update(settings)
        v.pop("reason", None)
        self._set_variant(name, Status.RUNNING)

    def variant_done(self, name: str, check_failed: bool = False) -> None:
        """Every point of the variant measured: `complete`, or `check_failed` when a point
        failed its data check. A reason says why a variant is unfinished: dropped."""
        self._set_variant(name, Status.CHECK_FAILED if check_failed else Status.COMPLETE)
        self._variant(name).pop("reason", None)

    def repeat_done(self, name: str, upto: int, repeats: int, check_failed: bool = False) -> None:
        """A launch measured the variant's repeats up to `upto` of `repeats`. The variant is
        done with its last repeat (or a failed check); until then it is unfinished, so a
        launcher that dies between repeats (each a launch of its own) leaves a run that
        --resume completes."""
        self.variant_done(name, check_failed)
        if upto < repeats and not check_failed:
            self._set_variant(name, Status.INTERRUPTED,
                              f"repeat {upto} of {repeats} done; each repeat is a launch of its own")

    def variant_interrupted(self, name: str, why: str) -> None:
        """A variant a stop left unfinished; a reason it had already is kept."""
        self._set_variant(name, Status.INTERRUPTED, self._variant(name).get("reason") or why)

    def variant_skipped(self, name: str, why: str) -> None:
        """A variant that cannot run here: recorded with why, and nothing else of it."""
        self.meta.setdefault("variants", {})[name] = {"status": Status.SKIPPED.value, "reason": why}

    def variant_failed(self, name: str, why: str) -> None:
        self._set_variant(name, Status.FAILED, why)

    def note_library(self, name: str, library: dict) -> None:
        """What the library says it used for a variant; a variant whose launch ended before
        its rank 0 recorded it is failed."""
        if name not in (self.meta.get("variants") or {}):
            self.variant_failed(name, "the launch ended before rank 0 recorded it")
        self._variant(name)["library"] = library

    def note_host_over_run(self, variant: str, over_run: dict, disturbed_points: int) -> None:
        """The host's state over a launch, and the points it disturbed, counted per variant
        (each a launch of its own into the run) and summed."""
        state = self.meta.get("host_state")
        if not isinstance(state, dict):
            return
        state["run"] = over_run
        per = state.setdefault("disturbed_by_variant", {})
        per[variant] = disturbed_points
        state["disturbed_points"] = sum(per.values())

    # --- the run's end ---
    def _mark(self, status: Status, reason: str | None) -> None:
        """The run's status (in memory), and no variant left `running` by it."""
        status = Status(status)
        if status != Status.RUNNING:
            for v in (self.meta.get("variants") or {}).values():
                if v.get("status") == Status.RUNNING:
                    v["status"] = status.value
        self.meta["status"] = status.value
        if reason:
            self.meta["reason"] = reason

    def settle(self) -> Status:
        """The run's status from its variants' (in memory)."""
        status = overall_status(self.meta.get("variants") or {})
        self.meta["status"] = status.value
        return status

    def end(self, status: Status | str | None = None, reason: str | None = None) -> None:
        """The run's end, stamped and written: with status, or (None) the status its
        variants settle to. Written last by the run's writer, after its results."""
        self.meta["finished"] = _now()
        self._mark(self.settle() if status is None else Status(status), reason)
        self.write()

    def interrupted(self, reason: str) -> None:
        """A stop while the run's last files were written (its rows are whole): written now."""
        self._mark(Status.INTERRUPTED, reason)
        self.write()

    def launcher_stopped(self, planned, signum: int) -> None:
        """A signal stopped the launcher of several launches (in memory): each planned
        variant not finished is interrupted (`not run` if no launch of it started), and so
        is the run."""
        said = f"{signal.Signals(signum).name} to the launcher stopped the run"
        for name in planned:
            ran = name in (self.meta.get("variants") or {})
            if self.variant_status(name) not in (Status.COMPLETE, Status.CHECK_FAILED, Status.SKIPPED):
                self.variant_interrupted(name, said if ran else f"not run: {said}")
        self._mark(Status.INTERRUPTED, self.meta.get("reason") or said)

    def settle_launch(self, argv: list[str], exit_status: int, interrupted: bool, why: str | None = None,
                      ours: bool | None = None, variant: str | None = None) -> None:
        """The launcher's last word on a launch its ranks could not mark (rank 0 killed, the
        job stopped). why: the signal that stopped the launcher (the ranks saw it as
        SIGTERM), or (not interrupted) its cause for stopping a job that never started: the
        run is failed with it, and gets a record if it had none. ours: whether rank 0 of
        this launch had taken the run over (None: not known); a `failed` another launch
        wrote stays. variant: this launch's, settled with the run; none is left `running`:
        no rank will finish it."""
        try:
            self.read()
        except (OSError, ValueError, UsageError):
            return
        status, ours, unstarted = self.status, ours is None or ours, bool(why and exit_status)
        if interrupted and (status == Status.RUNNING or (status == Status.FAILED and ours)):
            reason = self.meta.get("reason")
            if why:
                reason = f"{why}" + (f" ({reason})" if reason else "")
            status, reason = Status.INTERRUPTED, reason or "interrupted (SIGINT to the launcher)"
        elif unstarted and not interrupted:
            if not self.is_open_run():
                self.open_new(argv)
            status, reason = Status.FAILED, why
            if variant:
                self.variant_failed(variant, why)
        elif exit_status and status == Status.RUNNING:
            status, reason = Status.FAILED, f"ranks exited with status {exit_status} before rank 0 could finish the run"
        else:
            return
        if variant and ours and self.variant_status(variant) == Status.FAILED:
            self._set_variant(variant, status)
        self._mark(status, reason)
        self.write()

    def note_teardown(self, why: str) -> None:
        """A run whose ranks hung after it was marked: its status stays, the hang is noted."""
        try:
            self.read()
            self.meta["teardown"] = f"after the run was marked: {why}"
            self.write()
        except (OSError, ValueError, UsageError):
            pass

    # --- notes beside the state ---
    def point_skipped(self, point_key: str, benchmark: str, params: dict, reason: str) -> None:
        """A point that cannot run on this run's backend, device or nodes (no rows), written
        now. Once per key: it counts as done, and a resume does not ask again."""
        skipped = self.meta.setdefault("skipped_points", [])
        if all(s.get("point_key") != point_key for s in skipped):
            skipped.append({"point_key": point_key, "benchmark": benchmark, "params": dict(params), "reason": reason})
            self.write()

    def skipped_keys(self) -> set[str]:
        return {s["point_key"] for s in self.meta.get("skipped_points") or [] if isinstance(s, dict)
                and s.get("point_key")}

    def add_control(self, entry: dict) -> None:
        """One control measurement (store/controls.py), written now: a launch that dies in
        its sweep keeps the measurement of its start."""
        self.meta.setdefault("controls", []).append(dict(entry))
        self.write()

    def note_results(self, entries: dict) -> None:
        """What a benchmark concluded beside its rows (the pairs verdict), written now; every
        entry is also added to `<key>s`, a list, so a sweep of several such points keeps
        each one's."""
        for key, value in entries.items():
            self.meta[key] = value
            self.meta.setdefault(f"{key}s", []).append(value)
        self.write()

    def note_ab(self, ab: dict) -> None:
        """An `ab` side's setting, once its launch has ended (nobody else writes the record
        then); a record that is missing or damaged is left as it is."""
        if not self.path.is_file():
            return
        try:
            self.read()
        except UsageError:  # a damaged record: the run's own problem, said by compare
            return
        self.meta["ab"] = ab
        self.write()
