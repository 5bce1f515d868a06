"""The terminal table engine: tables in the report's style, columns with a level (ALWAYS,
COMPACT, WIDE), and print_table, which decides what a table shows at the console's width
without cutting a number. rich is imported inside the functions that draw.
"""
from __future__ import annotations

import textwrap


class _Column:
    def __init__(self, header: str, justify: str):
        self.header, self.justify, self._cells = header, justify, []


class LongTable:
    """A table of more than FAST_ROWS rows: the part of rich's Table that the report uses
    (add_column, add_row, columns, title, caption), its cells kept as text and laid out by
    print_table without rich (rich measures and renders every cell several times:
    milliseconds a row, hours for a run of 300k imported rows)."""

    def __init__(self, title: str, caption: str, plain: bool):
        self.title, self.caption, self.ascii = title, caption, plain
        self.columns: list[_Column] = []
        self.levels: dict = {}
        self.row_count = 0

    def add_column(self, header: str, justify: str = "left", no_wrap: bool = True) -> None:
        self.columns.append(_Column(header, justify))

    def add_row(self, *cells) -> None:
        for c, x in zip(self.columns, cells):
            c._cells.append(x)
        self.row_count += 1


def table(title: str, caption: str, plain: bool, nrows: int = 0):
    """A rich Table in the report's style; plain: ASCII borders (a file or a pipe). Title
    and caption are plain text: rich would take "[mpi/cpu]" for markup and drop it.
    Columns added with add_column carry a level that print_table reads. nrows: the rows it
    will hold; above FAST_ROWS, a LongTable."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    if nrows > FAST_ROWS:
        return LongTable(title, caption, plain)
    t = Table(title=escape(title), caption=escape(caption) if caption else None,
              box=box.ASCII if plain else box.SIMPLE_HEAD)
    t.levels = {}
    return t


# Column levels of a terminal table: ALWAYS columns are the point's identity and its headline
# figures; COMPACT ones are shown by default while the table fits the console; WIDE ones
# only with --wide (their values are in the caption, constant, or secondary).
ALWAYS, COMPACT, WIDE = 0, 1, 2


def add_column(t, header: str, left: bool = False, level: int = ALWAYS, wrap: bool = False,
               in_caption: bool = False, key: bool = False, words: bool = False) -> None:
    """A column of t. Only text made of words (a shape, a list of stages) may wrap: a
    number or a header is never wrapped, and print_table never lets rich cut one.
    in_caption: the caption already gives its one value (a dtype that never changes), so
    leaving it out goes unsaid. key: the column is part of what tells the rows apart (a
    param, a mode, a stage): print_table keeps it while its cells differ. words: each cell
    is a list of independent words (a shape "T=512 H=7168 ...", params "k=v ..."), so the
    words every cell shares may move to the caption; never for prose (a verdict, a warning),
    where dropping shared words would leave fragments that no longer read."""
    t.add_column(header, justify="left" if left else "right", no_wrap=not wrap)
    if not hasattr(t, "levels"):
        t.levels = {}
    t.levels[header] = level
    if in_caption:
        t.said = getattr(t, "said", set()) | {header}
    if key:
        t.keys = getattr(t, "keys", set()) | {header}
    if words:
        t.words = getattr(t, "words", set()) | {header}


def _drop_column(t, header: str) -> None:
    t.columns[:] = [c for c in t.columns if c.header != header]
    if not isinstance(t, LongTable):
        for i, c in enumerate(t.columns):
            c._index = i


def _cuts(t, width: int) -> bool:
    """Would rich cut a cell of t (an ellipsis) on a console `width` wide? Rendered, not
    estimated: rich's own layout decides which columns it squeezes."""
    import io

    from rich.console import Console

    c = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False, legacy_windows=False)
    c.print(t)
    return "\u2026" in c.file.getvalue()


def print_table(console, t, wide: bool = False) -> list[str]:
    """Print t on console without cutting a number or a header. wide: every column. Else
    columns are left out as _leave_out says, while the table is wider than the console;
    the caption names what was left out. A table that still does not fit is printed at the
    console's width when only its word columns wrap, else at its natural width (the
    terminal folds the long lines: nothing is lost). Returns the headers left out."""
    from rich.measure import Measurement
    from rich.segment import Segments

    if isinstance(t, LongTable):
        return _print_long_table(console, t, wide)

    def natural() -> int:
        return Measurement.get(console, console.options.update_width(100_000), t).maximum

    hidden = _leave_out(t, wide, lambda: natural() > console.width)
    natural_w = natural()
    fits = natural_w <= console.width or not _cuts(t, console.width)
    width = min(natural_w, console.width) if fits else natural_w
    # rich wraps a title or caption to the table's width: over a narrow table, a few words a
    # line. One longer than the table goes above / below it at the console's width.
    title = caption = None
    if t.title and len(str(t.title)) > width:
        title, t.title = t.title, None
    if t.caption and len(str(t.caption)) > width:
        caption, t.caption = t.caption, None
    if title:
        console.print(title, style="table.title")
    if fits:
        console.print(t)
    else:
        console.print(Segments(console.render(t, console.options.update_width(natural_w))), crop=False)
    if caption:
        console.print(caption, style="table.caption")
    return hidden


def _leave_out(t, wide: bool, too_wide) -> list[str]:
    """Leave columns of t out, in this order: the WIDE ones (unless wide); then, while
    too_wide(), each column whose every cell is the same, from the last (its one value goes
    to the caption: nothing is lost), then the COMPACT ones from the last. A key column
    whose cells differ tells the rows apart and stays (at 100 columns the overlap table
    keeps its progress mode, the MoE table its shape). Returns the headers left out."""
    if wide:
        return []
    levels, keys = getattr(t, "levels", {}), getattr(t, "keys", set())
    hidden = []
    for h, lv in levels.items():
        if lv >= WIDE and h in _headers(t):
            _drop_column(t, h)
            hidden.append(h)
    same = []
    if t.row_count > 1:
        heads = _headers(t)
        for c in reversed(list(t.columns)):
            if not too_wide():
                break
            cells = {str(x) for x in c._cells}
            # A header several columns share (one per variant) would not say which one.
            if len(cells) == 1 and heads.count(c.header) == 1:
                same.append((c.header, cells.pop()))
                _drop_column(t, c.header)
    common = _factor_words(t, too_wide)
    for h in reversed([h for h, lv in levels.items() if lv == COMPACT and h in _headers(t)]):
        if not too_wide():
            break
        if h in keys and len({str(x) for x in _cells(t, h)}) > 1:
            continue
        _drop_column(t, h)
        hidden.append(h)
    _say_hidden(t, hidden)
    said = [f"{' '.join(str(h).split())} {v or '-'}" for h, v in reversed(same)]
    said += [f"{' '.join(str(h).split())} {' '.join(words)} (the column gives the rest)" for h, words in common]
    if said:
        t.caption = (f"{t.caption}; " if t.caption else "") + "every row: " + ", ".join(said)
    return hidden + [h for h, _ in same]


def _factor_words(t, too_wide) -> list[tuple[str, list[str]]]:
    """While too_wide(): in each column of words that would wrap (a MoE shape, a list of
    params), the words every cell has ("T=512 H=7168 E=256 K=8 ... uniform") leave the cells
    for the caption, and each cell keeps what tells it apart ("expert", "rank"): a row on one
    line. Returns [(header, the common words)]."""
    out = []
    for c in getattr(t, "columns", []):
        if not too_wide():
            break
        if c.header not in getattr(t, "words", set()) or not all(isinstance(x, str) for x in c._cells):
            continue
        cells = [x.split() for x in c._cells]
        common = set(cells[0]).intersection(*cells[1:]) if cells else set()
        if not common or any(len(w) == len(common) for w in cells):
            continue  # nothing shared, or a cell that would be left empty
        c._cells = [" ".join(w for w in ws if w not in common) for ws in cells]
        out.append((c.header, [w for w in cells[0] if w in common]))
    return out


def _headers(t) -> list[str]:
    return [c.header for c in t.columns]


def _cells(t, header: str) -> list:
    return next((c._cells for c in t.columns if c.header == header), [])


def _say_hidden(t, hidden: list[str]) -> None:
    levels, said = getattr(t, "levels", {}), getattr(t, "said", set())
    if any(h not in said for h in hidden):
        shown = [" ".join(str(h).split()) for h in levels if h in hidden and h not in said]
        t.caption = (f"{t.caption}; " if t.caption else "") + f"not shown: {', '.join(shown)} (--wide shows them)"


# Above this many rows a table is laid out here, not by rich: rich measures and renders every
# cell several times (milliseconds a row), so a run of 300k imported rows would take hours.
# The layout is rich's for tables whose cells do not wrap: each column as wide as its widest
# cell, the same borders, the same columns left out, nothing cut.
FAST_ROWS = 200


def _print_long_table(console, t: LongTable, wide: bool) -> list[str]:
    widths = {c.header: max([len(str(c.header))] + [len(str(x)) for x in c._cells]) for c in t.columns}
    ascii_box = t.ascii

    def total() -> int:
        return sum(widths[c.header] + 2 for c in t.columns) + (len(t.columns) + 1 if ascii_box else 0)

    hidden = _leave_out(t, wide, lambda: total() > console.width)
    cols = list(t.columns)
    ws = [widths[c.header] for c in cols]

    spec = [("{:<%d}" if c.justify == "left" else "{:>%d}") % w for c, w in zip(cols, ws)]
    row_format = ("| " + " | ".join(spec) + " |\n") if ascii_box else (" " + "  ".join(spec) + " \n")

    def line(cells) -> str:
        return row_format.format(*map(str, cells))[:-1]

    width = total()
    out = []
    if t.title:
        s = t.title
        out.append(s.center(width).rstrip() if len(s) <= width else s)
    out.append(("+" + "-" * (width - 2) + "+") if ascii_box else "")
    out.append(line([c.header for c in cols]))
    out.append(("|" + "+".join("-" * (w + 2) for w in ws) + "|") if ascii_box else " " + "─" * (width - 2))
    f = console.file
    f.write("\n".join(x for x in out if x) + "\n")
    f.writelines(row_format.format(*cells) for cells in zip(*(c._cells for c in cols)))
    tail = [("+" + "-" * (width - 2) + "+")] if ascii_box else []
    if t.caption:
        s = t.caption
        tail.append(s.center(width).rstrip() if len(s) <= width else textwrap.fill(s, max(console.width, width)))
    f.write("\n".join(tail) + ("\n" if tail else ""))
    f.flush()
    return hidden
