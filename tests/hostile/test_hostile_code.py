"""Code from a data file: a suite file's variants (and a run's saved ones) set only the
communication libraries' settings and commbench's measurement settings; the suite file a
run uses is named, and a local one that shadows a shipped suite is said; the regression
gate's planted slowdown says so on the start line, in its rows and in the report, and a
delay that cannot be is refused before any rank starts."""
from __future__ import annotations

import json
import math
from dataclasses import asdict

import pandas as pd
import pytest

from commbench.core.errors import UsageError
from conftest import ROOT, make_row, needs_mpi, run_cli, run_rows

SMALL = ["-b", "all_reduce", "--sizes", "8,64", "--iters", "20", "--warmup", "1"]


def _one_line(r, *words):
    assert r.returncode == 2, (r.returncode, r.stdout[-1500:], r.stderr[-1500:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("commbench: error:"), r.stderr[-2000:]
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def _plugin(tmp_path):
    """plug/evilmod.py, which leaves a mark wherever it is imported; the mark's path."""
    mark = tmp_path / "imported.txt"
    (tmp_path / "plug").mkdir()
    (tmp_path / "plug" / "evilmod.py").write_text(f"open({str(mark)!r}, 'a').write('imported\\n')\n")
    return mark


def _evil_env() -> dict:
    # ROOT too: a rank that took this PYTHONPATH imports this checkout's commbench, and the plug-in
    return {"PYTHONPATH": f"plug:{ROOT}", "COMMBENCH_PLUGINS": "evilmod"}


# ------------------------------------------------------------ a suite file's variants

@pytest.mark.parametrize("key", ["PYTHONPATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "COMMBENCH_PLUGINS",
                                 "COMMBENCH_LAUNCHER_PID", "COMMBENCH_LAUNCH_ID", "COMMBENCH_REPEAT_UPTO",
                                 "COMMBENCH_RUN_LOCK", "COMMBENCH_TTY", "COMMBENCH_TTY_PATH", "COMMBENCH_PLANT_POINTS",
                                 "COMMBENCH_PLANT_DELAY_PCT", "COMMBENCH_MPICC", "COMMBENCH_CACHE", "PATH",
                                 "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "OMPI_MCA_mca_base_component_path",
                                 "OMPI_MCA_plm_rsh_agent", "PMIX_MCA_mca_base_component_path", "UCX_MODULE_DIR",
                                 "FI_PROVIDER_PATH", "NCCL_DEBUG_FILE", "NCCL_ALGO=Ring"])
def test_a_suite_variant_may_not_set_what_runs_code(key):
    from commbench.run.variants import env_refusal, parse_suite_variants

    assert env_refusal(key)
    with pytest.raises(UsageError, match=f"variant 'mine' may not set {key}"):
        parse_suite_variants({"mine": {"env": {"NCCL_ALGO": "Ring", key: "x"}}}, "suite s")


@pytest.mark.parametrize("key", ["TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"])
def test_a_blocking_wait_is_refused_with_why(key):
    from commbench.run.variants import parse_suite_variants

    with pytest.raises(UsageError, match=f"may not set {key}: .*stall"):
        parse_suite_variants({"mine": {"env": {key: "1"}}}, "suite s")


def test_library_settings_the_named_knobs_and_every_builtin_variant_pass():
    from commbench.run.variants import BUILTIN, VARIANT_KNOBS, env_refusal, parse_suite_variants

    ok = {"NCCL_ALGO": "Ring", "OMPI_MCA_coll_tuned_use_dynamic_rules": "1", "PMIX_MCA_gds": "hash", "UCX_TLS": "rc",
          "MPICH_ASYNC_PROGRESS": "1", "MPIR_CVAR_ALLREDUCE_INTRA_ALGORITHM": "ring", "FI_PROVIDER": "tcp",
          "GLOO_SOCKET_IFNAME": "lo", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1", "NCCL_TOPO_FILE": "topo.xml",
          **{k: "1" for k in VARIANT_KNOBS}}
    assert parse_suite_variants({"mine": {"env": ok}}, "suite s")["mine"].env == ok
    assert {"COMMBENCH_SYMM_MEM", "COMMBENCH_COMPILED_LOOP"} <= set(VARIANT_KNOBS)
    for v in BUILTIN.values():
        assert not [k for k in v.env if env_refusal(k, v.env[k])], v.name
    # every knob a variant may set is listed, with what it does, in docs/variants.md
    doc = (ROOT / "docs" / "variants.md").read_text()
    assert all(f"`{k}" in doc for k in VARIANT_KNOBS)


@needs_mpi
@pytest.mark.multirank
def test_a_suite_file_that_names_a_plugin_runs_no_code(tmp_path):
    """[variant.mine] env = {PYTHONPATH, COMMBENCH_PLUGINS}: refused in one line naming the
    key, before any rank starts: nothing imported, no run directory."""
    mark = _plugin(tmp_path)
    env = ", ".join(f'{k} = "{v}"' for k, v in _evil_env().items())
    (tmp_path / "evil.toml").write_text(f'benchmarks = ["all_reduce"]\nvariants = ["mine"]\n'
                                        f'[variant.mine]\nenv = {{ {env} }}\n')
    r = run_cli("run", "evil.toml", "--np", "2", *SMALL, "--out", "r", cwd=tmp_path, timeout=180)
    assert not mark.exists(), "a rank imported the suite's plug-in"
    line = _one_line(r, "variant 'mine' may not set")
    assert "PYTHONPATH" in line or "COMMBENCH_PLUGINS" in line
    assert not (tmp_path / "r").exists()


# ------------------------------------------------------------ a run directory's saved variants

def _saved_config(env: dict, with_name: bool) -> dict:
    """meta.json's config of a one-variant run, its variant table as a run saves it
    (with_name) or as a hand-edit leaves it (only the environment is wrong)."""
    from commbench.run.suite import build_config

    cfg = asdict(build_config({"name": "evil", "benchmarks": ["all_reduce"], "sizes": ["8"], "worlds": [2],
                               "iters": 5, "warmup": 1}))
    table = {"backend": None, "env": env, "inswitch": False, "requires": [], "description": "", "expect": {}}
    cfg.update(variants=["mine"], variant_defs={"mine": {"name": "mine", **table} if with_name else table})
    return json.loads(json.dumps(cfg))


def test_a_saved_variant_env_passes_the_same_check(tmp_path):
    from commbench.run.spec import config_from_saved

    for with_name in (False, True):
        with pytest.raises(UsageError, match="variant 'mine' may not set (PYTHONPATH|COMMBENCH_PLUGINS)"):
            config_from_saved(_saved_config(_evil_env(), with_name))
    cfg = config_from_saved(_saved_config({"OMPI_MCA_coll_tuned_use_dynamic_rules": "1"}, False))
    assert cfg.variant_defs["mine"]["env"] == {"OMPI_MCA_coll_tuned_use_dynamic_rules": "1"}


@needs_mpi
@pytest.mark.multirank
def test_resume_of_a_run_whose_meta_names_a_plugin_runs_no_code(tmp_path):
    """A hand-edited meta.json whose saved variant sets PYTHONPATH and COMMBENCH_PLUGINS:
    `run --resume DIR --np 2` is refused in one line, and no rank imports the module. The
    variant table carries no `name` key, so only its environment is wrong."""
    mark = _plugin(tmp_path)
    run = tmp_path / "r"
    run.mkdir()
    (run / "rows.jsonl").write_text("")
    meta = {"schema": 1, "status": "failed", "reason": "stopped", "suite": "evil", "backend": "mpi", "device": "cpu",
            "world": 2, "config": _saved_config(_evil_env(), False), "variants": {}, "argv": ["run", "evil.toml"]}
    (run / "meta.json").write_text(json.dumps(meta))
    before = (run / "meta.json").read_bytes()
    r = run_cli("run", "--resume", "r", "--np", "2", cwd=tmp_path, timeout=180)
    assert not mark.exists(), "a rank imported the saved variant's plug-in"
    line = _one_line(r, "--resume r:", "variant 'mine' may not set")
    assert "PYTHONPATH" in line or "COMMBENCH_PLUGINS" in line
    assert (run / "meta.json").read_bytes() == before


# ------------------------------------------------------------ which suite file

@pytest.mark.multirank
def test_a_local_suite_that_shadows_a_shipped_one_is_said(tmp_path):
    (tmp_path / "suites").mkdir()
    local = tmp_path / "suites" / "quick.toml"
    local.write_text('benchmarks = ["all_reduce"]\nsizes = ["8"]\n')
    r = run_cli("run", "quick", "--np", "2", "--backend", "mpi", "--dry-run", cwd=tmp_path, timeout=60)
    assert r.returncode == 0, r.stderr[-1500:]
    head = r.stdout.splitlines()[0]
    assert head.startswith("suite quick: 1 points on 2 ranks") and f"suite file {local}" in head, head
    note = next(x for x in r.stdout.splitlines() if "shadows" in x)
    assert note.startswith("note: ") and str(local) in note and "commbench/suites/quick.toml" in note
    # commbench list says which file each name comes from
    listed = run_cli("list", cwd=tmp_path, timeout=60)
    line = next(x for x in listed.stdout.splitlines() if x.split()[:1] == ["quick"])
    assert str(local) in line and "shadows" in line
    other = next(x for x in listed.stdout.splitlines() if x.split()[:1] == ["collectives"])
    assert "commbench/suites/collectives.toml" in other and "shadows" not in other
    # the shipped suite, or a path given: no shadow note, the file named
    r = run_cli("run", str(local), "--np", "2", "--backend", "mpi", "--dry-run", cwd=tmp_path, timeout=60)
    assert r.returncode == 0 and "shadows" not in r.stdout and f"suite file {local}" in r.stdout


# ------------------------------------------------------------ the planted slowdown

@pytest.mark.parametrize("pct", ["inf", "-inf", "nan", "1e9", "1001", "-1", "lots"])
def test_a_planted_delay_that_cannot_be_is_refused(pct):
    from commbench.run import plant

    env = {plant.POINTS_ENV: "all_reduce:float32:64", plant.PCT_ENV: pct}
    with pytest.raises(UsageError, match=plant.PCT_ENV):
        plant.setting(env)
    with pytest.raises(UsageError, match=plant.POINTS_ENV):
        plant.setting({plant.POINTS_ENV: "all_reduce:64", plant.PCT_ENV: "20"})
    assert plant.setting({plant.POINTS_ENV: "all_reduce:float32:64", plant.PCT_ENV: "1000"})[1] == 1000.0


@needs_mpi
@pytest.mark.multirank
def test_an_infinite_planted_delay_is_refused_before_any_rank_starts(tmp_path):
    env = {"COMMBENCH_PLANT_POINTS": "all_reduce:float32:64", "COMMBENCH_PLANT_DELAY_PCT": "inf"}
    r = run_cli("run", "quick", "--np", "2", *SMALL, "--timeout", "5", "--out", "r", cwd=tmp_path, env=env,
                timeout=120)
    _one_line(r, "COMMBENCH_PLANT_DELAY_PCT", "'inf'")
    assert not (tmp_path / "r").exists()


@needs_mpi
@pytest.mark.multirank
def test_planted_points_say_so_on_the_start_line_in_the_rows_and_the_report(tmp_path):
    env = {"COMMBENCH_PLANT_POINTS": "all_reduce:float32:64,all_reduce:float16:64", "COMMBENCH_PLANT_DELAY_PCT": "30"}
    r = run_cli("run", "quick", "--np", "2", *SMALL, "--out", "r", cwd=tmp_path, env=env, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    head = r.stdout.splitlines()[0]
    assert head.startswith("suite quick: 2 points on 2 ranks, backend mpi; suite file ") and \
        head.endswith("commbench/suites/quick.toml"), head
    warn = next(x for x in r.stderr.splitlines() if "COMMBENCH_PLANT_POINTS" in x)
    assert warn.startswith("warning: ") and "COMMBENCH_PLANT_DELAY_PCT=30" in warn
    assert "1 point(s) of this run by 30 %: all_reduce:float32:64" in warn
    rows = {x["nbytes"]: x for x in run_rows(tmp_path / "r")}
    assert rows[64]["planted_delay_pct"] == 30.0 and "planted_delay_pct" not in rows[8]
    rep = run_cli("report", "r", "--out", "rep", cwd=tmp_path, timeout=120)
    assert rep.returncode == 0, rep.stderr[-1500:]
    said = [x for x in rep.stdout.splitlines() if "planted" in x]
    assert len(said) == 1 and "all_reduce float32 64 B +30 %" in said[0] and "8 B" not in said[0], said
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "planted slowdown" in md and "all_reduce float32 64 B +30 %" in md


def test_rows_without_the_planted_field_still_read_and_compare_matches_planted_sides(tmp_path):
    from commbench.analyse.compare import compare_runs
    from commbench.core.schema import OPTIONAL_ROW_SCHEMA, ROW_FIELDS, normalize_row
    from commbench.report.sections import check_findings
    from commbench.report.terminal import planted_line
    from commbench.store.load import load

    assert "planted_delay_pct" in OPTIONAL_ROW_SCHEMA and "planted_delay_pct" not in ROW_FIELDS
    old = make_row(nbytes=64)
    assert "planted_delay_pct" not in normalize_row(dict(old))
    run = tmp_path / "old"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"status": "complete", "suite": "quick", "world": 2}))
    (run / "rows.jsonl").write_text(json.dumps(old) + "\n")
    df = load(run)
    assert len(df) == 1 and planted_line(df) is None
    assert not [f for f in check_findings(df) if f.measure == "planted slowdown"]
    # one planted row among others: said, and only it
    mixed = pd.DataFrame([make_row(nbytes=8), make_row(nbytes=64, planted_delay_pct=20.0)])
    assert "all_reduce float32 64 B +20 %" in planted_line(mixed) and "8 B" not in planted_line(mixed)
    # the gate's sides plant the same points at 0 % and 20 %: the field is no part of a point
    sides = [pd.DataFrame([make_row(nbytes=64, p50=p, planted_delay_pct=pct, run=name)])
             for name, p, pct in (("a", 1.0, 0.0), ("p", 1.2, 20.0))]
    res = compare_runs(*sides)
    assert len(res) == 1 and not res.iloc[0]["only_in"], res.to_dict("records")
    assert math.isclose(float(res.iloc[0]["ratio"]), 1.2, rel_tol=1e-6)
