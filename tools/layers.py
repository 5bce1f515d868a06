#!/usr/bin/env python3
"""The layer rule of commbench's folders: each layer imports only layers below it.

    core < moe < backends < benchmarks < store < analyse < report < run < commands < (cli, __init__, __main__)

Every import counts: module level, inside functions, and the `python -c` strings of tools/.
Also lists the in-package imports made inside functions outside cli.py (the header of a
module should say what it depends on; only imports beside a heavy library may wait).

And three rules within the layers: a rank never imports the launcher (RANK_MODULES,
LAUNCHER_MODULES: the contract between them is run/contract.py); the harness never imports
report/; only the record (store/record.py) writes a run's status.

Usage: python tools/layers.py [PACKAGE_DIR] [EXTRA.py ...]
  exit 1 and each climbing import (file:line importer -> imported), each import that breaks
  a rule and each status write outside the record when there are any.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ORDER = ["core", "moe", "backends", "benchmarks", "store", "analyse", "report", "run", "commands", "top"]
RANK = {name: i for i, name in enumerate(ORDER)}
HEAVY = {"torch", "jax", "jaxlib", "mpi4py", "cupy", "matplotlib", "pandas"}


def layer_of(module: str, pkg: str) -> str | None:
    """`pkg.run.launcher` -> "run"; the package's own top-level modules are "top"."""
    parts = module.split(".")
    if parts[0] != pkg:
        return None
    if len(parts) == 1:
        return "top"
    return parts[1] if parts[1] in RANK else "top"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(tree: ast.AST, me: str | None, is_pkg: bool):
    """(lineno, module, inside a function, the function's heavy imports) for each import."""
    def visit(node, in_func, heavy):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                mine = set()
                for n in ast.walk(child):
                    if isinstance(n, ast.Import):
                        mine |= {a.name.split(".")[0] for a in n.names}
                    elif isinstance(n, ast.ImportFrom) and not n.level and n.module:
                        mine.add(n.module.split(".")[0])
                yield from visit(child, True, mine & HEAVY)
                continue
            if isinstance(child, ast.Import):
                for a in child.names:
                    yield child.lineno, a.name, in_func, heavy
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    if me is None:
                        continue
                    base = me.split(".") if is_pkg else me.split(".")[:-1]
                    base = base[:len(base) - child.level + 1]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                for a in child.names:
                    yield child.lineno, f"{mod}.{a.name}", in_func, heavy
            else:
                yield from visit(child, in_func, heavy)
    yield from visit(tree, False, set())


def heavy_modules(sources: list, pkg: str) -> set[str]:
    """Modules of the package that pull a heavy library in when imported (their own
    module-level imports, followed through the package): an import of one of them may wait
    inside the function that needs it."""
    deps = {}
    for path, me, is_pkg in sources:
        got = set()
        for node in ast.parse(path.read_text()).body:
            for lineno, mod, in_func, _ in imported(ast.Module(body=[node], type_ignores=[]), me, is_pkg):
                got.add(mod)
        deps[me] = got
    known = set(deps)

    def owner(mod: str) -> str | None:
        while mod and mod not in known:
            mod = mod.rpartition(".")[0]
        return mod or None

    heavy, changed = set(), True
    while changed:
        changed = False
        for me, got in deps.items():
            if me in heavy:
                continue
            if any(g.split(".")[0] in HEAVY or owner(g) in heavy for g in got if owner(g) != me):
                heavy.add(me)
                changed = True
    return heavy


def check(root: Path, extra: list[Path]) -> tuple[list[str], list[str]]:
    pkg = root.name
    climbs, lazy = [], []
    sources = [(p, module_name(p, root), p.name == "__init__.py") for p in sorted(root.rglob("*.py"))]
    heavy_mods = heavy_modules(sources, pkg)
    sources += [(p, None, False) for p in extra]
    for path, me, is_pkg in sources:
        text = path.read_text()
        trees = [(ast.parse(text), 0)]
        if me is None:  # a tool: its `-c` strings too
            for node in ast.walk(trees[0][0]):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and pkg in node.value:
                    try:
                        trees.append((ast.parse(node.value.replace("; ", "\n")), node.lineno - 1))
                    except SyntaxError:
                        pass
        mine = layer_of(me, pkg) if me else "top"
        for tree, offset in trees:
            for lineno, mod, in_func, heavy in imported(tree, me, is_pkg):
                theirs = layer_of(mod, pkg)
                if theirs is None:
                    continue
                where = f"{path}:{lineno + offset}"
                if RANK[theirs] > RANK[mine]:
                    climbs.append(f"{where}: {me or path.name} ({mine}) imports {mod} ({theirs})")
                target = mod if mod in heavy_mods else mod.rpartition(".")[0]
                if me and in_func and not heavy and target not in heavy_mods and not me.endswith(".cli"):
                    lazy.append(f"{where}: {me} imports {mod} inside a function")
    return climbs, lazy


# --- the rules within a layer ---------------------------------------------------------------
# A rank (one process of a launch) never imports the launcher, not even through another
# module: what the two say to each other is in run/contract.py, which both import. The
# modules a rank runs, and those of the launcher, by name:
RANK_MODULES = ("run.rank_run", "run.point_harness", "run.guard")
LAUNCHER_MODULES = ("run.launcher", "run.launcher_variants", "commands.run")
# The measuring loop imports nothing from report/ (it measures; what a person reads is made
# elsewhere), through no other module either.
HARNESS_MODULES = ("run.point_harness",)
NO_HARNESS_LAYER = "report"
# The one writer of a run's, a variant's and a repeat's status in meta.json.
RECORD_MODULE = "store.record"


def import_graph(root: Path) -> dict[str, list[tuple[int, str]]]:
    """Each module of the package -> (line, module of the package it imports), every import
    counted (module level and inside functions); a name imported from a module counts as
    that module."""
    pkg = root.name
    sources = [(p, module_name(p, root), p.name == "__init__.py") for p in sorted(root.rglob("*.py"))]
    known = {me for _, me, _ in sources}

    def owner(mod: str) -> str | None:
        while mod and mod not in known:
            mod = mod.rpartition(".")[0]
        return mod or None

    graph = {}
    for path, me, is_pkg in sources:
        edges = []
        for lineno, mod, _, _ in imported(ast.parse(path.read_text()), me, is_pkg):
            target = owner(mod) if mod.split(".")[0] == pkg else None
            if target and target != me:
                edges.append((lineno, target))
        graph[me] = edges
    return graph


def reached(graph: dict, start: str) -> dict[str, list[str]]:
    """Every module `start` imports, directly or through others -> the chain that gets there."""
    chains, todo = {start: [start]}, [start]
    while todo:
        me = todo.pop(0)
        for _, target in graph.get(me, ()):
            if target not in chains:
                chains[target] = chains[me] + [target]
                todo.append(target)
    return chains


def import_rules(root: Path) -> list[str]:
    """A rank module that reaches a launcher module, a harness module that reaches report/,
    and a module these lists name that does not exist."""
    pkg, graph, out = root.name, import_graph(root), []
    for group in (RANK_MODULES, LAUNCHER_MODULES, HARNESS_MODULES):
        out += [f"{pkg}.{m} is named in tools/layers.py but is no module" for m in group if f"{pkg}.{m}" not in graph]
    launchers = {f"{pkg}.{m}" for m in LAUNCHER_MODULES}
    for rank in RANK_MODULES:
        for target, chain in reached(graph, f"{pkg}.{rank}").items():
            if target in launchers:
                out.append(f"rank module {chain[0]} imports launcher module {target}: {' -> '.join(chain)}")
    for harness in HARNESS_MODULES:
        for target, chain in reached(graph, f"{pkg}.{harness}").items():
            if layer_of(target, pkg) == NO_HARNESS_LAYER:
                out.append(f"harness module {chain[0]} imports {target}: {' -> '.join(chain)}")
    return out


def _is_status(node) -> bool:
    return isinstance(node, ast.Constant) and node.value == "status"


def status_writes(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, how) of each write of a "status" key: `x["status"] = ...`, `{"status": ...}`,
    `.update(status=...)`, `dict(status=...)`, `.setdefault("status", ...)`."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = list(node.targets) if isinstance(node, ast.Assign) else [node.target]
            while targets:
                t = targets.pop()
                if isinstance(t, (ast.Tuple, ast.List)):
                    targets += t.elts
                elif isinstance(t, ast.Subscript) and _is_status(t.slice):
                    out.append((node.lineno, '["status"] = ...'))
        elif isinstance(node, ast.Dict) and any(k is not None and _is_status(k) for k in node.keys):
            out.append((node.lineno, '{"status": ...}'))
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in ("update", "dict") and any(k.arg == "status" for k in node.keywords):
                out.append((node.lineno, f"{name}(status=...)"))
            elif name == "setdefault" and node.args and _is_status(node.args[0]):
                out.append((node.lineno, 'setdefault("status", ...)'))
    return out


def status_rule(root: Path) -> list[str]:
    """Each status write outside the record, as `file:line: module writes ...`."""
    pkg, out = root.name, []
    for path in sorted(root.rglob("*.py")):
        me = module_name(path, root)
        if me != f"{pkg}.{RECORD_MODULE}":
            out += [f"{path}:{lineno}: {me} writes {how}" for lineno, how in status_writes(ast.parse(path.read_text()))]
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[1]).resolve() if len(argv) > 1 else Path(__file__).resolve().parent.parent / "commbench"
    extra = [Path(a) for a in argv[2:]]
    climbs, lazy = check(root, extra)
    for c in climbs:
        print("climb:", c)
    for line in lazy:
        print("lazy:", line)
    print(f"{len(climbs)} climbing import(s); {len(lazy)} in-package import(s) inside functions "
          "without a heavy library beside them (outside cli.py)")
    rules = import_rules(root)
    status = status_rule(root)
    for line in rules:
        print("rule:", line)
    for line in status:
        print("status:", line)
    print(f"{len(rules)} rank/launcher or harness/report import(s); {len(status)} status write(s) outside the "
          f"record ({root.name}.{RECORD_MODULE})")
    return 1 if climbs or rules or status else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
