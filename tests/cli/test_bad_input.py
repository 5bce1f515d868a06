"""The malformed-input corpus: every entry ends with one line naming the problem and exit
status 2, no traceback, no result directory, and no rank started."""
from __future__ import annotations

import pytest

from conftest import needs_mpi, run_cli

PROFILE_OK = ('name = "x"\n[scaleup]\nlink = "L"\nline_rate = "450 GB/s per direction"\n'
              'achieved_rate = "300 GB/s per direction"\ndomain_gpus = 8\nlatency_us = 1.0\n'
              '[hbm]\nbandwidth = "3 TB/s total"\n')

# (id, suite file text or None, CLI args after `run`, words the error must contain)
CORPUS = [
    ("unknown-suite", None, ["no-such-suite"], "unknown suite"),
    ("unknown-key", 'benchmarks = ["all_reduce"]\nsizez = ["8"]\n', [], "unknown key 'sizez'"),
    ("sizes-wrong-type", 'benchmarks = ["all_reduce"]\nsizes = 5\n', [], "'sizes'"),
    ("sizes-empty", 'benchmarks = ["all_reduce"]\nsizes = []\n', [], "empty list"),
    ("sizes-inverted", 'benchmarks = ["all_reduce"]\nsizes = { min = "1M", max = "1K" }\n', [], "inverted"),
    ("dtypes-empty", 'benchmarks = ["all_reduce"]\ndtypes = []\n', [], "'dtypes'"),
    ("worlds-zero", 'benchmarks = ["all_reduce"]\nworlds = [0]\n', [], "'worlds'"),
    ("worlds-string", 'benchmarks = ["all_reduce"]\nworlds = ["a"]\n', [], "'worlds'"),
    ("benchmarks-empty", 'benchmarks = []\n', [], "no benchmarks"),
    ("toml-syntax", 'benchmarks = ["all_reduce"\n', [], "suite"),
    ("check-not-bool", 'benchmarks = ["all_reduce"]\ncheck = "yes"\n', [], "'check'"),
    ("timeout-negative", 'benchmarks = ["all_reduce"]\ntimeout_s = -1\n', [], "timeout_s"),
    ("unknown-benchmark", None, ["quick", "-b", "nope"], "unknown benchmark 'nope'"),
    ("unknown-backend", None, ["quick", "--backend", "carrier-pigeon"], "carrier-pigeon"),
    ("unknown-dtype", None, ["quick", "--dtypes", "float128"], "float128"),
    ("unknown-profile", None, ["quick", "--profile", "dgx-9000"], "unknown profile"),
    ("unknown-timing", None, ["quick", "--timing", "sideways"], "--timing: invalid choice: 'sideways'"),
    ("suite-timing", 'benchmarks = ["all_reduce"]\ntiming = "sideways"\n', [], "'timing'"),
    ("suite-backend", 'benchmarks = ["all_reduce"]\nbackend = "pigeon"\n', [], "'backend'"),
    ("graph-on-mpi", None, ["quick", "--backend", "mpi", "--cuda-graph"], "--cuda-graph needs the nccl backend"),
    ("bad-size", None, ["quick", "--sizes", "12 parsecs"], "size"),
    ("zero-size", None, ["quick", "--sizes", "0"], "size"),
    ("np-zero", None, ["quick", "--np", "0"], "--np must be >= 1"),
    ("iters-negative", None, ["quick", "--iters", "-1"], "'iters'"),
    ("min-time-zero", None, ["quick", "--min-time-ms", "0"], "min_time_ms"),
    ("timeout-zero", None, ["quick", "--timeout", "0"], "timeout_s"),
    ("world-too-big", None, ["quick", "--np", "2", "--worlds", "8"], "8"),
    ("size-cannot-split", None, ["quick", "--np", "4", "-b", "all_to_all", "--sizes", "10"], "10"),
    ("param-wrong-type", None, ["moe", "--np", "2", "--param", "moe.topk=abc"], "topk"),
    ("param-unknown", None, ["quick", "--param", "frobnicate=1"], "frobnicate"),
    ("moe-experts-indivisible", None, ["moe", "--np", "2", "--worlds", "2", "--param", "moe.experts=7"], "experts"),
    ("moe-topk-over-experts", None, ["moe", "--np", "2", "--param", "moe.experts=8", "--param", "moe.topk=9"], "top"),
    ("moe-groups-over", None, ["moe", "--np", "2", "--worlds", "2", "--param", "moe.routing=group_limited",
                               "--param", "moe.max_groups=3"], "group"),
    ("moe-negative-skew", None, ["moe", "--np", "2", "--param", "moe.routing=zipf", "--param", "moe.alpha=-1"],
     "alpha"),
    ("moe-fp8-hidden", None, ["moe", "--np", "2", "--param", "moe.hidden=100"], "128"),
    ("over-memory", None, ["quick", "--np", "2", "-b", "all_reduce", "--sizes", "64G", "--backend", "gloo"],
     "available"),
    ("count-overflow", None, ["quick", "--np", "2", "-b", "all_reduce", "--sizes", "9G", "--backend", "mpi"],
     "2^31-1"),
    ("resume-missing", None, ["--resume", "/no/such/run"], "not a commbench run directory"),
    ("nic-without-profile", None, ["quick", "--nic-gbps", "800"], "need --profile"),
    ("variant-unknown-key", 'benchmarks = ["all_reduce"]\nvariants = ["x"]\n[variant.x]\nenvv = {}\n', [],
     "unknown key 'envv'"),
    ("variant-unknown-backend", 'benchmarks = ["all_reduce"]\nvariants = ["x"]\n[variant.x]\nbackend = "pigeon"\n', [],
     "unknown backend"),
    ("variant-empty-name", 'benchmarks = ["all_reduce"]\nvariants = [""]\n', [], "empty name"),
    ("variant-duplicate", 'benchmarks = ["all_reduce"]\nvariants = ["default", "default"]\n', [], "named twice"),
    ("variant-unknown", None, ["quick", "--variant", "warp-drive"], "unknown variant 'warp-drive'"),
    ("profile-missing-field", "PROFILE:" + PROFILE_OK.replace("domain_gpus = 8\n", ""), [], "domain_gpus"),
    ("profile-negative-rate", "PROFILE:" + PROFILE_OK.replace('"450 GB', '"-450 GB'), [], "line_rate"),
    ("profile-unknown-unit", "PROFILE:" + PROFILE_OK.replace("450 GB/s", "450 furlongs/s"), [], "unit"),
    ("profile-no-direction", "PROFILE:" + PROFILE_OK.replace("450 GB/s per direction", "450 GB/s"), [], "direction"),
    # Numbers that would disable the watchdog, never end, or leave a half-made directory.
    ("timeout-nan", None, ["quick", "--timeout", "nan"], "finite"),
    ("timeout-inf", 'benchmarks = ["all_reduce"]\ntimeout_s = inf\n', [], "finite"),
    ("timeout-tiny", None, ["quick", "--timeout", "1e-9"], "at least 1"),
    ("iters-huge", None, ["quick", "--iters", "99999999999999999999"], "<= 1000000000"),
    ("warmup-huge", 'benchmarks = ["all_reduce"]\nwarmup = 9999999999999999999\n', [], "'warmup'"),
    ("sizes-empty-flag", None, ["quick", "--sizes", ""], "--sizes is empty"),
    ("suite-binary", "BINARY", [], "not a text"),
    ("params-not-table", 'benchmarks = ["all_reduce"]\n[params]\nall_reduce = 5\n', [], "'params'"),
    ("out-dev-null", None, ["quick", "--out", "/dev/null"], "not a directory"),
    ("out-under-dev-null", None, ["quick", "--out", "/dev/null/run"], "not a directory"),
    ("out-under-a-file", None, ["quick", "--out", "/etc/hostname/run"], "not a directory"),
]


def test_corpus_is_big_enough():
    assert len(CORPUS) >= 25


@needs_mpi
@pytest.mark.parametrize("case, text, args, words", CORPUS, ids=[c[0] for c in CORPUS])
@pytest.mark.multirank
def test_malformed_input_is_one_line_exit_2(tmp_path, case, text, args, words):
    args = list(args)
    if text and text.startswith("PROFILE:"):
        (tmp_path / "p.toml").write_text(text[len("PROFILE:"):])
        args = ["quick", "--np", "2", "--profile", str(tmp_path / "p.toml")]
    elif text == "BINARY":
        (tmp_path / "bad.toml").write_bytes(b"\x00\xff\xfe\x80 binary")
        args = [str(tmp_path / "bad.toml"), "--np", "2"] + args
    elif text is not None:
        (tmp_path / "bad.toml").write_text(text)
        args = [str(tmp_path / "bad.toml"), "--np", "2"] + args
    r = run_cli("run", *args, cwd=tmp_path, timeout=120)
    assert r.returncode == 2, (r.stdout[-500:], r.stderr[-1500:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("commbench: error:"), r.stderr
    assert "Traceback" not in r.stderr
    assert words in lines[0], lines[0]
    assert not (tmp_path / "results").exists(), "a result directory was left behind"
