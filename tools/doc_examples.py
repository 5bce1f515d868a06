#!/usr/bin/env python3
"""Write the example tables of README.md and docs/*.md from real runs, so that they show
what commbench prints now and on what host.

    .venv/bin/python tools/doc_examples.py [NAME ...] [--list] [--print]

An example is a pair of markers in a page:

    <!-- example: quick -->
    (written by this script: `$ ` and the command, the table it printed, and a line with the
    host's state: cores, load average, date, commit, the rows that ran disturbed)
    <!-- /example -->

For each example named in EXAMPLES (all of them by default) the script runs the command
(a small, fast form, the one the page shows) as a user would, output to a pipe 100 columns
wide (COLUMNS=100) and results in a temporary directory, cuts the table whose title starts
with the example's `title` out of what it printed, and replaces what stands between the
markers of every page that has them. --print shows the blocks instead of writing them.

tests/house/test_docs.py checks that the headers of every stored example are headers the table
code prints now: after a column is renamed, this script brings the examples back in line.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from commbench.core.hoststate import cores

ROOT = Path(__file__).resolve().parent.parent
WIDTH = 100
# name -> the command as the page shows it (`--out` is added), and the title of the table kept.
EXAMPLES = {
    "quick": {"command": "commbench run quick --np 2 -b all_reduce --worlds 2 --sizes 8,64K,4M",
              "title": "all_reduce  ["},
    "moe": {"command": "commbench run moe --np 2 --worlds 2 --param tokens=512 --param copies=rank,expert",
            "title": "moe dispatch/combine  ["},
}
MARK = re.compile(r"(<!-- example: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /example -->)", re.S)
# Lines after a table's caption that are not part of it.
_AFTER = ("results:", "warning:", "error:", "note:", "no ", "variant ", "commbench:", "run ", "  ")


def pages() -> list[Path]:
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


def cut_table(out: str, title: str) -> str | None:
    """The table of `out` whose title line starts with `title` (after its centring): title,
    box and caption, as printed; None when there is none."""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if not (line.strip().startswith(title) and i + 1 < len(lines) and lines[i + 1].startswith("+")):
            continue
        j = i + 1
        borders = 0
        while j < len(lines) and lines[j][:1] in "+|":
            borders += lines[j].startswith("+")
            j += 1
            if borders == 2:
                break
        while j < len(lines):  # the caption: up to a blank line, the next table's title or a message
            nxt = lines[j + 1] if j + 1 < len(lines) else ""
            if not lines[j].strip() or nxt.startswith("+") or lines[j].startswith(_AFTER):
                break
            j += 1
        return "\n".join(ln.rstrip() for ln in lines[i:j]).strip("\n")
    return None


def commit() -> str:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{' with local changes' if dirty else ''}" if head else "unknown"


def disturbed(out_dir: Path) -> tuple[int, int]:
    """(rows that ran disturbed or oversubscribed, rows) of a run directory."""
    n = bad = 0
    try:
        for line in (out_dir / "rows.jsonl").read_text().splitlines():
            r = json.loads(line)
            n += 1
            bad += bool(r.get("disturbed") or r.get("oversubscribed"))
    except (OSError, ValueError):
        pass
    return bad, n


def run_example(name: str, spec: dict, tmp: Path) -> str:
    """Run the example's command; the block to write between its markers."""
    words = shlex.split(spec["command"])
    assert words[0] == "commbench", spec["command"]
    out_dir = tmp / name
    env = {**os.environ, "COLUMNS": str(WIDTH), "COMMBENCH_TTY": "0"}
    load = os.getloadavg()
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "commbench", *words[1:], "--out", str(out_dir)], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=900)
    took = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"doc_examples: {name}: `{spec['command']}` exited {p.returncode}:\n{p.stderr[-2000:]}")
    table = cut_table(p.stdout, spec["title"])
    if table is None:
        raise SystemExit(f"doc_examples: {name}: no table titled {spec['title']!r} in:\n{p.stdout[-3000:]}")
    bad, n = disturbed(out_dir)
    state = (f"_Produced by `tools/doc_examples.py` on {time.strftime('%Y-%m-%d')} at commit {commit()}: "
             f"{cores()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start, "
             f"{took:.1f} s; {bad} of {n} rows ran disturbed or oversubscribed._")
    return f"```\n$ {spec['command']}\n{table}\n```\n\n{state}\n"


def write(blocks: dict[str, str]) -> list[str]:
    """Put each block between its markers in every page that has them; the pages changed."""
    changed = []
    for page in pages():
        text = page.read_text()
        new = MARK.sub(lambda m: m.group(1) + blocks.get(m.group("name"), m.group("body")) + m.group(4), text)
        if new != text:
            page.write_text(new)
            changed.append(str(page.relative_to(ROOT)))
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"examples to regenerate (default: all: {', '.join(EXAMPLES)})")
    ap.add_argument("--list", action="store_true", help="the examples, their commands and the pages that hold them")
    ap.add_argument("--print", action="store_true", help="print the blocks, write nothing")
    args = ap.parse_args(argv)
    if args.list:
        for name, spec in EXAMPLES.items():
            where = [str(p.relative_to(ROOT)) for p in pages() if f"<!-- example: {name} -->" in p.read_text()]
            print(f"{name}: {spec['command']}  (in {', '.join(where) or 'no page'})")
        return 0
    unknown = [n for n in args.names if n not in EXAMPLES]
    if unknown:
        ap.error(f"unknown example(s) {', '.join(unknown)}; known: {', '.join(EXAMPLES)}")
    blocks = {}
    with tempfile.TemporaryDirectory(prefix="doc-examples-") as tmp:
        for name in args.names or list(EXAMPLES):
            print(f"{name}: {EXAMPLES[name]['command']}", flush=True)
            blocks[name] = run_example(name, EXAMPLES[name], Path(tmp))
    if args.print:
        print("\n".join(blocks.values()))
        return 0
    changed = write(blocks)
    print(f"examples {', '.join(blocks)}: " + (f"written into {', '.join(changed)}" if changed else "no page changed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
