"""The documentation's commands are real: every `commbench ...` command in README.md and
docs/*.md parses with commbench's own argparse parser, every `make TARGET` named exists in
the Makefile, README.md stays short enough to read in ten minutes, and its example tables
(tools/doc_examples.py) have the columns the tool prints now."""
from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from commbench.cli import build_parser
from commbench.core.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 300
SUBCOMMANDS = ("run", "list", "report", "compare", "ab", "import", "ceilings", "model", "routing")
# `commbench` followed by a subcommand, as a word of its own (not `commbench.load`, not a path
# such as commbench/suites/quick.toml).
COMMAND = re.compile(r"(?<![\w./-])commbench\s+(?=(?:%s)\b)" % "|".join(SUBCOMMANDS))
MAKE = re.compile(r"(?<![\w./-])make\s+(?=[-\w])")
# Shell syntax the parser cannot judge: a command substitution, a pipe, a redirection or a
# second command on the line. The command is cut at the first of them; what comes before is
# still checked, so only the tail of such a line goes unchecked.
SHELL_CUT = re.compile(r"\s(?:\||\|\||&&|;|>|2>|<)\s|\$\(|\)|`")
# Synopsis words that stand for "more of the same" (RUN.., A1 A2 ... ) and add no flag.
ELLIPSIS = {"..", "...", "…"}


def doc_files() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def code_spans(text: str):
    """(line number, text) of every fenced code block line and every inline code span."""
    fence = False
    for no, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if fence:
            yield no, line
        else:
            for m in re.finditer(r"(`+)(.+?)\1", line):
                yield no, m.group(2)


def words_after(span: str, start: int) -> list[str] | None:
    """The shell words of a command from `start` to the end of the command (a comment, a
    pipe, a second command end it); None when the words do not split as a shell would."""
    rest = span[start:]
    cut = SHELL_CUT.search(rest)
    if cut:
        rest = rest[:cut.start()]
    try:
        words = shlex.split(rest, comments=True)
    except ValueError:
        return None
    # A synopsis's optional part `[--np N]` is checked as if given; ellipses are dropped.
    words = [w.strip("[]") for w in words]
    return [w for w in words if w and w not in ELLIPSIS]


def commands(kind: re.Pattern):
    for path in doc_files():
        for no, span in code_spans(path.read_text()):
            for m in kind.finditer(span):
                yield f"{path.relative_to(ROOT)}:{no}", span, words_after(span, m.end())


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    targets = set()
    for m in re.finditer(r"^([A-Za-z0-9_.-][A-Za-z0-9_. -]*?)\s*:(?!=)", text, re.M):
        targets.update(m.group(1).split())
    return targets


def parse_error(words: list[str]) -> str | None:
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            build_parser().parse_args(words)
    except UsageError as e:
        return str(e)
    except SystemExit as e:  # --help and argparse's own exits
        return None if e.code == 0 else f"exit {e.code}"
    return None


def test_docs_exist_and_name_commands():
    found = list(commands(COMMAND))
    assert (ROOT / "docs").is_dir()
    assert len(found) >= 40, "the docs should show the commands they describe"
    assert list(commands(MAKE)), "the docs should name make targets"


def test_every_commbench_command_parses():
    bad = []
    for where, span, words in commands(COMMAND):
        if words is None:
            bad.append(f"{where}: unbalanced quotes in {span!r}")
            continue
        # Prose names a subcommand as `commbench report`: a name, not a command line; the
        # regex already made sure the subcommand exists.
        if len(words) == 1 and span.strip() == f"commbench {words[0]}":
            continue
        err = parse_error(words)
        if err:
            bad.append(f"{where}: {' '.join(words)!r}: {err}")
    assert not bad, "commands in the docs that commbench's parser refuses:\n" + "\n".join(bad)


def test_every_make_target_exists():
    targets = make_targets()
    bad = []
    for where, span, words in commands(MAKE):
        if words is None:
            bad.append(f"{where}: unbalanced quotes in {span!r}")
            continue
        # make's own options (-o FILE, -C DIR, -j N) and VAR=value words are not targets.
        named, skip = [], False
        for w in words:
            if skip:
                skip = False
            elif w in ("-o", "-C", "-f", "-j", "-W"):
                skip = True
            elif not w.startswith("-") and "=" not in w:
                named.append(w)
        missing = [t for t in named if t not in targets]
        if missing:
            bad.append(f"{where}: make {' '.join(missing)} (no such target in the Makefile)")
    assert not bad, "\n".join(bad)


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n < README_MAX_LINES, f"README.md has {n} lines; new documentation goes to docs/"


def test_readme_links_to_docs_that_exist_or_are_listed():
    """Every docs/ page README links to is present, except the pages written beside these."""
    text = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\((docs/[\w.-]+\.md)(?:#[\w-]+)?\)", text))
    assert linked, "README should point to docs/"
    missing = {p for p in linked if not (ROOT / p).is_file()}
    assert missing <= PAGES_ELSEWHERE, f"README links to missing pages: {sorted(missing - PAGES_ELSEWHERE)}"


def test_links_between_pages_resolve():
    """Links from one docs/ page to another (and their #anchors) lead somewhere."""
    bad = []
    for path in sorted((ROOT / "docs").glob("*.md")):
        for target, anchor in re.findall(r"\]\(([\w.-]+\.md)(?:#([\w-]+))?\)", path.read_text()):
            page = ROOT / "docs" / target
            if not page.is_file():
                if f"docs/{target}" not in PAGES_ELSEWHERE:
                    bad.append(f"{path.name}: {target}")
                continue
            if anchor and anchor not in {_anchor(h) for h in re.findall(r"^#+ (.+)$", page.read_text(), re.M)}:
                bad.append(f"{path.name}: {target}#{anchor}")
    assert not bad, bad


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


# Pages that other parts of the documentation own; README links to them before they land.
PAGES_ELSEWHERE = {"docs/running.md", "docs/import.md", "docs/hostile-use.md", "docs/bounds-and-errors.md",
                   "docs/verdicts.md", "docs/gpu.md", "docs/model.md", "docs/reports.md"}


@pytest.mark.parametrize("words, ok", [
    (["run", "quick", "--np", "2"], True),
    (["run", "quick", "--no-such-flag"], False),
    (["compare", "A1", "A2", "--", "B1", "B2"], True),
    (["frobnicate"], False),
])
def test_parse_check_can_fail(words, ok):
    """The parse check itself tells a good command from a bad one."""
    assert (parse_error(words) is None) is ok


def test_extraction_reads_shell_lines():
    span = "NP=8 srun -N 2 commbench run collectives --backend mpi   # a comment | not a pipe"
    m = COMMAND.search(span)
    assert words_after(span, m.end()) == ["run", "collectives", "--backend", "mpi"]
    span = "commbench run SUITE [--np N] ... > out.txt"
    assert words_after(span, COMMAND.search(span).end()) == ["run", "SUITE", "--np", "N"]
    assert not COMMAND.search("commbench.load(paths)") and not COMMAND.search("commbench/suites/run.toml")


# ---------------------------------------------------------------------------------------
# Example tables: tools/doc_examples.py writes them between markers from real runs; their
# columns must be the columns the table code prints now (a renamed column fails here: rerun
# `.venv/bin/python tools/doc_examples.py`).

EXAMPLE = re.compile(r"<!-- example: (?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- /example -->", re.S)


def stored_examples() -> list[tuple[str, str]]:
    return [(f"{p.relative_to(ROOT)}:{m.group('name')}", m.group("body"))
            for p in doc_files() for m in EXAMPLE.finditer(p.read_text())]


def example_table(body: str) -> tuple[str, list[str], list[str]]:
    """(the table's title, the headers of its columns, the columns its caption says are not
    shown) of an example's ASCII table; a header on two lines is read as one."""
    lines = body.splitlines()
    top = next(i for i, ln in enumerate(lines) if ln.startswith("+"))
    sep = next(i for i in range(top + 1, len(lines)) if lines[i].startswith("|-"))
    cells = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines[top + 1:sep]]
    heads = [" ".join(x for x in col if x) for col in zip(*cells)]
    bottom = next(i for i in range(sep + 1, len(lines)) if lines[i].startswith("+"))
    caption = " ".join(ln.strip() for ln in lines[bottom + 1:] if not ln.startswith("```"))
    hidden = re.search(r"not shown: (.*?) \(--wide shows them\)", caption)
    return lines[top - 1].strip(), heads, hidden.group(1).split(", ") if hidden else []


def _rows_like_a_run(bench: str) -> list[dict]:
    """Rows of `bench` with every field its table reads, as a run on the loopback writes them."""
    from conftest import make_row

    judged = {"tier": "scaleup", "bottleneck": "shared memory (memcpy)", "ceiling_gbps": 9.4,
              "ceiling_achieved_gbps": 9.4, "compared_as": "busbw", "profile": "loopback", "run": "r"}
    if bench != "moe":
        return [make_row(bench, 2, s, 5.0 + s / 1e3, time_bound_us=s / 9.4e3, pct_of_ceiling=10.0 + i,
                         pct_of_achieved=10.0 + i, **judged) for i, s in enumerate((8, 1 << 16, 1 << 22))]
    rows = []
    for copies in ("rank", "expert"):
        for stage, dt in (("dispatch", "fp8"), ("combine", "bf16")):
            p = {"tokens": 512, "hidden": 7168, "experts": 256, "topk": 8, "copies": copies, "routing": "uniform"}
            rows.append(make_row("moe", 2, 0, 2e4 if copies == "rank" else 7e4, stage=stage, dtype=dt, params=p,
                                 placement=None, logical_gbps=0.3, remote_gbps=0.15, scaleup_gbps=0.15,
                                 scaleout_gbps=0.0, load_max_over_mean=1.01, hottest_rank=1, outside_a2a_pct=20.0,
                                 stage_us_layout=300.0, stage_us_a2a=1.5e4, stage_us_reduce=3e3,
                                 routed_nbytes=7.6e6, sent_nbytes=2.4e8, time_bound_us=500.0, pct_of_ceiling=2.0,
                                 **{**judged, "compared_as": "per-tier bytes"}))
    return rows


def produced_table(bench: str) -> tuple[str, set[str]]:
    """(title, every header) of the table the code builds for rows of `bench` now, before
    the printing leaves any column out."""
    from commbench.benchmarks.base import for_rows
    from commbench.report import terminal, views

    rows = _rows_like_a_run(bench)
    b = for_rows(bench)
    tables = views.tables(b, rows, True) or [terminal.collective_table(bench, b, rows, True)]
    return (str(tables[0].title).replace("\\[", "["),
            {" ".join(str(c.header).split()) for t in tables for c in t.columns})


def test_readme_examples_come_from_the_tool():
    names = {n.split(":", 1)[1] for n, _ in stored_examples() if n.startswith("README.md:")}
    assert {"quick", "moe"} <= names, "README's example tables go between <!-- example: NAME --> markers"
    for where, body in stored_examples():
        assert "Produced by `tools/doc_examples.py` on " in body and " cores, load average " in body, where


def test_example_tables_have_the_columns_the_tool_prints_now():
    """Every column of a stored example (shown, or named as not shown) is a column the table
    code gives rows of its benchmark now, under the same title; the check itself catches a
    column under its old name."""
    old = ("```\n$ commbench run moe\n   moe dispatch/combine  [mpi/cpu]\n+------+\n| shape | stage | logical |\n"
           "|-------+-------+---------|\n| rank | dispatch | 0.1 |\n+------+\nnot shown: p99 (us) (--wide shows them)\n```")
    title, heads, hidden = example_table(old)
    assert heads == ["shape", "stage", "logical"] and hidden == ["p99 (us)"]
    assert [h for h in heads + hidden if h not in produced_table(title.split()[0])[1]] == ["logical"]
    bad = []
    examples = stored_examples()
    assert examples, "no example tables between <!-- example: NAME --> markers in README.md or docs/"
    for where, body in examples:
        title, heads, hidden = example_table(body)
        bench = title.split()[0]
        got_title, produced = produced_table(bench)
        if title.split("[")[0].strip() != got_title.split("[")[0].strip():
            bad.append(f"{where}: title {title!r}, the tool's {got_title!r}")
        stale = [h for h in heads + hidden if h not in produced]
        if stale:
            bad.append(f"{where}: columns {stale} are not the tool's ({sorted(produced)})")
    assert not bad, "stale example tables (rerun .venv/bin/python tools/doc_examples.py):\n" + "\n".join(bad)
