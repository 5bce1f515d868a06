"""What the launcher and its ranks say to each other lives in one module (run/contract.py),
which a rank imports instead of the launcher; the measuring loop imports nothing from
report/; and how tables are shown (--wide, --style, --verbose) is a value passed to what
prints them, never a module global."""
from __future__ import annotations

import ast
import importlib.util
import io
from pathlib import Path

import pytest
from rich.console import Console

from conftest import make_row

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "commbench"


def _layers():
    spec = importlib.util.spec_from_file_location("layers_tool", ROOT / "tools" / "layers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# The environment variables the launcher sets for its ranks.
CONTRACT_VARIABLES = {"COMMBENCH_LAUNCH_ID": "LAUNCH_ID_ENV", "COMMBENCH_LAUNCHER_PID": "LAUNCHER_PID_ENV",
                      "COMMBENCH_REPEAT_UPTO": "REPEAT_UPTO_ENV", "COMMBENCH_RUN_LOCK": "RUN_LOCK_ENV"}


def test_the_contract_names_live_in_one_module():
    from commbench.run import contract

    for var, name in CONTRACT_VARIABLES.items():
        assert getattr(contract, name) == var
    for name in ("new_launch_id", "check_launcher_pid", "repeat_upto", "hold_for_launch", "held_by_my_launcher",
                 "marked_path", "say_marked", "say_once", "job_key", "failure_path", "rank_path", "slot_path"):
        assert callable(getattr(contract, name)), name
    # Spelled out nowhere else in the package: every other module names them through it.
    elsewhere = []
    for p in PKG.rglob("*.py"):
        if p == PKG / "run" / "contract.py":
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Constant) and node.value in CONTRACT_VARIABLES:
                elsewhere.append(f"{p.relative_to(ROOT)}:{node.lineno}: {node.value}")
    assert not elsewhere, elsewhere


def test_no_rank_module_imports_the_launcher_but_each_reaches_the_contract():
    layers = _layers()
    graph = layers.import_graph(PKG)
    launchers = {f"commbench.{m}" for m in layers.LAUNCHER_MODULES}
    for rank in layers.RANK_MODULES:
        reach = layers.reached(graph, f"commbench.{rank}")
        assert not launchers & set(reach), {m: reach[m] for m in launchers & set(reach)}
    assert "commbench.run.contract" in layers.reached(graph, "commbench.run.rank_run")
    assert "commbench.run.contract" in layers.reached(graph, "commbench.run.guard")
    assert layers.import_rules(PKG) == []


def test_the_harness_imports_no_report_module():
    layers = _layers()
    reach = layers.reached(layers.import_graph(PKG), "commbench.run.point_harness")
    assert not [m for m in reach if m.startswith("commbench.report")], reach


def test_the_rank_and_the_launcher_agree_through_the_contract(tmp_path, monkeypatch):
    """A marker rank 0 leaves is where the launcher looks for it, and a repeat the launcher
    names bounds the rank's repeats."""
    from commbench.run import contract

    lid = contract.new_launch_id()
    monkeypatch.setenv(contract.LAUNCH_ID_ENV, lid)
    for what in contract.MARKS:
        contract.say_marked(what, tmp_path)
        assert contract.marked_path(tmp_path, lid, what).is_file()
    assert contract.repeat_upto(3, {contract.REPEAT_UPTO_ENV: "2"}) == 2
    assert contract.repeat_upto(3, {}) == 3
    assert contract.repeat_upto(3, {contract.REPEAT_UPTO_ENV: "x"}) == 3
    assert contract.launch_id_or_new() == lid
    assert contract.launcher_pid({contract.LAUNCHER_PID_ENV: "1"}) is None
    assert contract.launcher_pid({contract.LAUNCHER_PID_ENV: "4242"}) == 4242
    prog = contract.progress_dir(tmp_path)
    assert contract.failure_paths(prog, lid) == []
    contract.failure_path(prog, lid, 1).write_text("{}")
    contract.failure_path(prog, "another-launch", 0).write_text("{}")
    assert contract.failure_paths(prog, lid) == [contract.failure_path(prog, lid, 1)]


def test_no_module_global_carries_a_view_setting():
    """No `global` statement in report/ (the view settings were set by cli through them and
    read by the tables a rank prints)."""
    found = [f"{p.relative_to(ROOT)}:{n.lineno}: global {', '.join(n.names)}"
             for p in (PKG / "report").rglob("*.py") for n in ast.walk(ast.parse(p.read_text()))
             if isinstance(n, ast.Global)]
    assert not found, found


def _rows():
    return [make_row("all_reduce", 2, 8 << i, 10.0 + i, iters=1234, busbw_factor=1.0, time_us_p99=30.0,
                     time_us_max=40.0, ceiling_gbps=9.4, pct_of_achieved=50.0, time_bound_us=1.0, run="r")
            for i in range(4)]


def _printed(view) -> str:
    from commbench.report.terminal import print_tables

    console = Console(file=io.StringIO(), width=120, force_terminal=False, color_system=None)
    print_tables(_rows(), console=console, view=view)
    return " ".join(console.file.getvalue().split())


def test_the_view_passed_down_decides_the_tables():
    from commbench.report.viewsettings import View

    compact, wide = _printed(View(wide=False)), _printed(View(wide=True))
    assert "iters" not in compact.split("not shown:")[0] and "(--wide shows them)" in compact
    assert "iters" in wide and "not shown:" not in wide
    # The same call again, with the other value: nothing kept from the call before.
    assert _printed(View(wide=False)) == compact
    osu = _printed(View(style="osu"))
    assert "p50 (us)" not in osu and osu != compact


def test_a_rank_reads_the_view_from_its_argv_as_the_command_line_does():
    from commbench.cli import build_parser
    from commbench.report.viewsettings import View, from_argv, from_flags

    for argv in (["run", "quick", "--np", "2", "--wide", "--style", "osu", "--sizes", "8:64"],
                 ["run", "quick", "--style=nccl-tests", "--verbose", "--out", "x"],
                 ["run", "quick", "--wid"],
                 ["run", "quick"]):
        assert from_argv(argv) == from_flags(build_parser().parse_args(argv)), argv
    assert from_argv(["run", "quick", "--wide", "--verbose"]) == View(wide=True, verbose=True)
    assert from_argv([]) == View()


@pytest.mark.multirank
def test_a_rank_of_run_np_prints_its_tables_as_the_launcher_was_told(tmp_path):
    """`run --np 2 --wide`: the tables rank 0 prints keep every column; without the flag the
    secondary columns are left out, said in the caption."""
    import subprocess
    import sys

    def tables(*flags):
        p = subprocess.run([sys.executable, "-m", "commbench", "run", "-b", "all_reduce", "--sizes", "64", "--np", "2",
                            "--backend", "gloo", "--iters", "3", "--warmup", "1", "--out", str(tmp_path / str(flags)),
                            *flags], capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert p.returncode == 0, p.stderr
        return " ".join(p.stdout.split())

    wide, compact = tables("--wide"), tables()
    assert "iters" in wide and "(--wide shows them)" not in wide, wide
    assert "(--wide shows them)" in compact, compact
