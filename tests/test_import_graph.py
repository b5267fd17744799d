"""The import graph of sim/, policies/, training/, deploy/ and the ROS package.

Read from source with `ast` (nothing is imported), at every depth: imports inside
functions, methods, `try:` and `if TYPE_CHECKING:` blocks count, because lazy imports
are exactly how import loops and heavy dependencies hide. What it enforces (DESIGN.md,
"Import direction"):

- `sim` and `policies` are leaves; `deploy` uses neither `training` nor `policies` (it
  may use `sim`: sim2sim runs an env); `training` may use the rest but not the ROS package.
- A robot computer needs no torch: only `deploy/export.py` imports torch, and it imports
  nothing of the project but `deploy.*` (turning a checkpoint into a module is training's job).
- The ROS policy node (`policy_node`, `controller`, `observation` and every `sim2real_ros`
  module they pull in) uses only `deploy.*` (not the torch-bound `deploy.export`); the
  simulated robot node may use `sim` but reads no other object's private attributes.
- No import loops: they make every refactor a puzzle and break on import order.

Graph model. Module names are `sim.x`, `training.core.losses`, `sim2real_ros.x`; a
package's node is its `__init__.py`. `import a.b.c` is an edge to `a.b.c`; `from a.b
import c` is an edge to `a.b.c` when that is a module, otherwise to `a.b`. Importing a
module also runs its parent packages' `__init__`, so `x -> a.b.c` implies `x -> a.b` and
`x -> a`, except for the importer's own packages: those are already in `sys.modules`
while it runs. So `training/core/__init__.py` importing its submodules, or
`training/storage.py` doing `from training.core import gae`, is not a loop. But a
submodule that explicitly imports its own package (`from training.core import x` inside
`training/core/losses.py`, while `training/core/__init__.py` re-exports losses) IS one:
at import time it reads a half-initialized package. A module importing itself is one too.
Not seen: `importlib.import_module(name)` with a computed name (sim.registry's lazy tasks).
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = dict.fromkeys(["sim", "policies", "training", "deploy"], ROOT) | {
    "sim2real_ros": ROOT / "ros_ws" / "src" / "sim2real_ros"  # top package -> its parent folder
}
POLICY_NODE = ("sim2real_ros.policy_node", "sim2real_ros.controller", "sim2real_ros.observation")
SIM_ROBOT_NODE = "sim2real_ros.sim_robot_node"
EXPORT = "deploy.export"


def parse_imports(source: str, module: str, is_package: bool, known: set[str]) -> dict[str, int]:
    """Every module `module` imports (name -> first line), at any depth, relative resolved."""
    package = module if is_package else module.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0]  # level 1: this package
                base = f"{parent}.{node.module}" if node.module else parent
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for name in names:
            found[name] = min(found.get(name, node.lineno), node.lineno)
    return found


def import_edges(imports: dict[str, dict[str, int]], packages: set[str]) -> dict[str, set[str]]:
    """Project-internal edges, with the parent-package rule of the module docstring."""
    graph: dict[str, set[str]] = {}
    for mod, names in imports.items():
        own = _ancestors(mod) | ({mod} if mod in packages else set())
        graph[mod] = set()
        for name in names:
            target = next((p for p in _prefixes(name) if p in imports), None)
            if target is not None:
                graph[mod].add(target)
                graph[mod] |= {a for a in _ancestors(target) if a in imports} - own
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of size > 1, plus modules that import themselves."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(comp) > 1 or v in graph.get(v, ()):
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _prefixes(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def _ancestors(name: str) -> set[str]:
    return set(_prefixes(name)[1:])


def _top(name: str) -> str:
    return name.split(".")[0]


@functools.cache
def tree() -> tuple[dict[str, dict[str, int]], dict[str, Path], dict[str, set[str]]]:
    """(imports per module, file per module, project edges) of the checked-out tree."""
    files: dict[str, Path] = {}
    for top, base in SOURCE_ROOTS.items():
        for path in sorted((base / top).rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    packages = {m for m, p in files.items() if p.name == "__init__.py"}
    imports = {
        m: parse_imports(p.read_text(encoding="utf-8"), m, m in packages, set(files))
        for m, p in files.items()
    }
    return imports, files, import_edges(imports, packages)


def _fail_if(violations: list[str], claim: str) -> None:
    if violations:
        text = f"{claim} -- {len(violations)} violation(s):\n  " + "\n  ".join(violations)
        pytest.fail(text, pytrace=False)


def _imports_matching(mods, forbidden, note=None) -> list[str]:
    """'mod imports name  (file:line)' for each import of `mods` that `forbidden` flags."""
    imports, files, _ = tree()
    return [
        f"{mod} imports {name}  ({files[mod].relative_to(ROOT)}:{line}{(note or {}).get(mod, '')})"
        for mod in mods
        for name, line in sorted(imports[mod].items(), key=lambda kv: kv[1])
        if forbidden(name)
    ]


def _check_direction(part: str, forbidden: set[str]) -> None:
    mods = sorted(m for m in tree()[0] if _top(m) == part)
    bad = _imports_matching(mods, lambda n: _top(n) in forbidden)
    _fail_if(bad, f"{part} must not import {', '.join(sorted(forbidden))}")


def test_sim_imports_no_training_deploy_policies_or_ros():
    _check_direction("sim", {"training", "deploy", "policies", "sim2real_ros"})


def test_policies_import_no_sim_training_deploy_or_ros():
    _check_direction("policies", {"sim", "training", "deploy", "sim2real_ros"})


def test_deploy_imports_no_training_or_policies():
    _check_direction("deploy", {"training", "policies", "sim2real_ros"})


def test_training_imports_no_ros_package():
    _check_direction("training", {"sim2real_ros"})


def test_ros_package_imports_no_training_or_policies():
    _check_direction("sim2real_ros", {"training", "policies"})


def test_robot_side_deploy_modules_import_no_torch():
    mods = sorted(m for m in tree()[0] if _top(m) == "deploy" and m != EXPORT)
    bad = _imports_matching(mods, lambda n: _top(n) == "torch")
    _fail_if(bad, f"only {EXPORT} may import torch under deploy/")


def test_deploy_export_imports_only_torch_onnx_numpy_stdlib_and_deploy():
    allowed = {"torch", "onnx", "onnxruntime", "numpy", "deploy"} | set(sys.stdlib_module_names)
    bad = _imports_matching([EXPORT], lambda n: _top(n) not in allowed)
    _fail_if(bad, f"{EXPORT} may import only torch, onnx, onnxruntime, numpy, stdlib, deploy.*")


def _forbidden_on_robot(name: str) -> bool:
    torch_bound = name == EXPORT or name.startswith(EXPORT + ".")
    return torch_bound or _top(name) in {"torch", "sim", "training", "policies"}


def test_policy_node_modules_import_only_deploy_and_ros():
    graph = tree()[2]
    via, queue = dict.fromkeys(POLICY_NODE, ""), list(POLICY_NODE)
    for mod in queue:  # every sim2real_ros module the node pulls in, transitively
        for dep in sorted(graph[mod] - set(via)):
            if _top(dep) == "sim2real_ros":
                via[dep] = f", pulled in by {mod}"
                queue.append(dep)
    bad = _imports_matching(queue, _forbidden_on_robot, via)
    _fail_if(bad, "the policy node may import only deploy.* (not torch-bound deploy.export)")


def test_sim_robot_node_reads_no_private_attributes():
    path = tree()[1][SIM_ROBOT_NODE]
    found = {
        (node.lineno, ast.unparse(node))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
        and not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"})
    }
    bad = [f"{text}  ({path.relative_to(ROOT)}:{line})" for line, text in sorted(found)]
    _fail_if(bad, f"{SIM_ROBOT_NODE} must use sim's public API, not private attributes")


def test_no_import_cycles():
    graph = tree()[2]
    bad = [
        f"loop among {len(c)} modules: {', '.join(c)}"
        + "".join(f"\n      {m} -> {', '.join(sorted(graph[m] & set(c)))}" for m in c)
        for c in find_cycles(graph)
    ]
    _fail_if(bad, "modules must not import each other in a loop")


# --- the checker itself -----------------------------------------------------------------

KNOWN = {"pkg", "pkg.a", "pkg.b", "pkg.sub", "pkg.sub.b", "pkg.sub.c"}


def test_checker_parses_lazy_relative_and_from_imports():
    src = (
        "from typing import TYPE_CHECKING\nimport torch.nn\nfrom . import b\nfrom .b import name\n"
        "from ..a import thing\nfrom pkg.sub import c, helper\n"
        "if TYPE_CHECKING:\n    import numpy\n"
        "def f():\n    from deploy.export import x\n"
        "class K:\n    def m(self):\n        import pkg.a\n"
    )
    got = parse_imports(src, "pkg.sub.c", False, KNOWN)
    assert set(got) == set(
        "typing torch.nn pkg.sub.b pkg.sub pkg.a pkg.sub.c numpy deploy.export".split()
    )
    assert got["deploy.export"] == 10
    init = parse_imports("from . import a\nfrom .a import x\n", "pkg", True, KNOWN)
    assert set(init) == {"pkg.a"}


def test_checker_finds_planted_cycle():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"a"}, "b": set()}) == [["a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_checker_package_init_rule():
    packages = {"pkg"}
    # __init__ re-exports a and b; a imports its sibling b; x imports pkg.a: no loop.
    imports = {"pkg": {"pkg.a": 1, "pkg.b": 1}, "pkg.a": {"pkg.b": 1}, "pkg.b": {}}
    imports["x"] = {"pkg.a": 1}
    assert find_cycles(import_edges(imports, packages)) == []
    assert import_edges(imports, packages)["x"] == {"pkg.a", "pkg"}
    # b imports its own package, which is importing b: a real loop.
    imports["pkg.b"] = {"pkg": 1}
    assert find_cycles(import_edges(imports, packages)) == [["pkg", "pkg.a", "pkg.b"]]
