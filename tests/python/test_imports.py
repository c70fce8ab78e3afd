"""Every module of python/ and bench/ imports on its own, and no two import each other.

Two checks over the same set of modules:

- the import graph, read from the source (``ast``): an edge A -> B for every
  ``import``/``from ... import`` of a project module at A's module level. A
  cycle (a strongly connected component of more than one module, or a module
  importing itself) fails, however the cycle happens to be broken at run time;
  so does an import of a project module inside a function (the usual way a
  cycle is hidden); imports inside functions are for optional third-party
  dependencies only;
- each module imported alone: heavy third-party packages (torch, TensorFlow)
  are imported once, then a fork per module imports just that module into an
  interpreter that holds none of the project's modules, so a module that only
  works after another has been imported fails here.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ROOT / "python"
BENCH = ROOT / "bench"


def _module_name(path: Path) -> str:
    """The dotted name a file is imported as: packages under python/, bench/ as a package."""
    base = PACKAGES if PACKAGES in path.parents else ROOT
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> Dict[str, Path]:
    mods = {}
    for top in [PACKAGES / "shoal", PACKAGES / "smdistributed", BENCH]:
        for p in sorted(top.rglob("*.py")):
            if "__pycache__" in p.parts or any(part.startswith(".") for part in p.parts):
                continue
            mods[_module_name(p)] = p
    return mods


def _resolve(current: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = current.split(".")
    if not is_pkg:
        base = base[:-1]
    if node.level > 1:
        base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, known: Set[str]) -> Tuple[Set[str], List[str]]:
    """(project modules imported at module level, project imports found inside functions)."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    top: Set[str] = set()
    nested: List[str] = []

    def targets(node) -> Set[str]:
        out = set()
        if isinstance(node, ast.Import):
            for a in node.names:
                out.add(a.name)
        else:
            mod = _resolve(name, is_pkg, node)
            out.add(mod)
            for a in node.names:                 # `from pkg import submodule`
                if f"{mod}.{a.name}" in known:
                    out.add(f"{mod}.{a.name}")
        # a project module, or the package a dotted name lives in
        found = set()
        for t in out:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t:
                found.add(t)
        return found

    def optional(node: ast.Try) -> bool:
        names = set()
        for h in node.handlers:
            for t in (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]):
                names.add(getattr(t, "id", None))
        return bool(names & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException", None})

    def walk(node, in_function: bool, in_optional: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                hit = targets(child)
                if not in_function:
                    top.update(hit)
                elif not in_optional:
                    # bench scripts may load the library under test when a run asks for it
                    nested.extend(sorted(h for h in hit if not (name.startswith("bench.") and
                                                                not h.startswith("bench."))))
            fn = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            opt = isinstance(child, ast.Try) and optional(child)
            walk(child, in_function or fn, in_optional or opt)
    walk(tree, False, False)
    # a package's own parents are imported first by Python itself, not an edge of the module
    top.discard(name)
    return top, nested


def find_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    out: List[List[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[v] = min(low[v], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _graph():
    mods = project_modules()
    known = set(mods)
    graph, nested = {}, {}
    for name, path in mods.items():
        graph[name], nested[name] = imports_of(name, path, known)
    # importing a.b.c imports its parent packages first: not an edge of c's own making
    for name in graph:
        parents = {name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1)}
        graph[name] -= parents
    return mods, graph, nested


def test_the_cycle_finder_finds_cycles():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []
    assert find_cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}) == [["a", "b"], ["c", "d"]]


def test_no_import_cycle_and_no_project_import_inside_a_function():
    mods, graph, nested = _graph()
    assert len(mods) > 60, f"only {len(mods)} modules found under python/ and bench/"
    assert graph["shoal.modelparallel.model"], "the import graph reads no edges"
    cycles = find_cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)
    inside = {n: v for n, v in nested.items() if v}
    assert not inside, ("project modules imported inside functions (hidden cycles; import at the top, or "
                        "move the shared piece to a leaf module): " +
                        "; ".join(f"{n}: {', '.join(v)}" for n, v in sorted(inside.items())))


def import_each_alone() -> List[str]:
    """Imports torch (with DTensor, which shoal.modelparallel imports: half a second a module
    otherwise) and TensorFlow, then each project module in a fork of its own that holds no
    project module; returns the failures."""
    for heavy in ("numpy", "torch", "torch.distributed", "torch.distributed.tensor", "tensorflow"):
        try:
            __import__(heavy)
        except ImportError:
            pass
    sys.path.insert(0, str(ROOT))
    failures = []
    for name in sorted(project_modules()):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:   # the child: forget every project module, import one, report
            os.close(r)
            code = 0
            try:
                for m in [m for m in sys.modules if m.split(".")[0] in ("shoal", "smdistributed", "bench")]:
                    del sys.modules[m]
                __import__(name)
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                os.write(w, f"{type(e).__name__}: {e}"[:2000].encode())
                code = 1
            os.close(w)
            os._exit(code)
        os.close(w)
        msg = b""
        while chunk := os.read(r, 4096):
            msg += chunk
        os.close(r)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            failures.append(f"{name}: {msg.decode(errors='replace') or f'exit status {status}'}")
    return failures


def test_every_module_imports_on_its_own():
    # in a process of its own: torch and TensorFlow stay out of the test runner
    proc = subprocess.run([sys.executable, __file__, "--alone"], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    assert proc.returncode == 0, ("modules that do not import on their own:\n" + proc.stdout +
                                  proc.stderr[-3000:])


if __name__ == "__main__":
    if sys.argv[1:] == ["--alone"]:
        bad = import_each_alone()
        print("\n".join(bad))
        sys.exit(1 if bad else 0)
    sys.exit(pytest.main([__file__, "-q"]))
