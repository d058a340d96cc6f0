"""Every import points down the flow (RULES.md, issue 33): files -> input -> model -> trust ->
attribution -> checks -> report -> pipeline -> (multihost, compare) -> CLI | HTTP routes.

The test reads every module's imports (at module level, inside functions and under
TYPE_CHECKING alike: a type-only import back up the flow is still a loop in the drawing) and
fails on one that names a later stage, or on a loop between modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tb_gpuadvisor

PACKAGE = Path(tb_gpuadvisor.__file__).parent
# The stages in flow order; a module may import its own stage's modules and earlier stages'.
LAYERS = (
    ("arrays", "cores", "heap", "stages", "metadata", "kinds", "vocab", "timeline", "schema"),
    ("input",),
    ("model",),
    ("trust",),
    ("attribution",),
    ("checks",),
    ("report", "render", "stepview"),
    ("pipeline",),
    ("multihost", "compare"),
    # The package's own __init__ ("") is the public API (tb_gpuadvisor.advise): the top, as the CLI.
    ("cli", "service", "plugin", "loader", "inloop", "keras", "jax", "torch", "lightning", "transformers",
     "notebook", "frontend", ""),
)


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["tb_gpuadvisor", *parts])


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    return next(i for i, names in enumerate(LAYERS) if top in names)


def imports() -> dict[str, set[str]]:
    """Each product module and the product modules it imports (``from pkg import mod`` names mod)."""
    found: dict[str, set[str]] = {}
    modules = {_module(p) for p in PACKAGE.rglob("*.py")} | {_module(p) for p in PACKAGE.rglob("*.c")}
    for path in PACKAGE.rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names if a.name.startswith("tb_gpuadvisor")}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("tb_gpuadvisor"):
                sub = {f"{node.module}.{a.name}" for a in node.names} & modules
                names |= sub or {node.module}
        found[_module(path)] = names - {_module(path)}
    return found


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((m, i) for m, deps in graph.items() for i in deps
                  if i != "tb_gpuadvisor" and _layer(i) > _layer(m))


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import loops between modules (a package's __init__ counts as the package)."""
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                found.append(path[path.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def test_every_import_points_down_the_flow():
    assert upward(imports()) == []


def test_no_import_loops():
    assert loops(imports()) == []


def test_the_check_sees_an_upward_import():
    graph = {"tb_gpuadvisor.model.steps": {"tb_gpuadvisor.checks.context"}}
    assert upward(graph) == [("tb_gpuadvisor.model.steps", "tb_gpuadvisor.checks.context")]
    assert loops({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]


def _registers(path: Path) -> bool:
    """Whether the module declares a check (a function decorated with ``register(...)``)."""
    return any(isinstance(d, ast.Call) and getattr(d.func, "id", None) == "register"
               for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef)
               for d in node.decorator_list)


def test_checks_share_helpers_through_modules_not_through_each_other():
    """A check (a module that registers one) imports no other check: what two checks share
    (fixes, measurements) lives in a module of its own, so a check can be removed alone."""
    checks = {_module(p) for p in (PACKAGE / "checks").glob("*.py") if _registers(p)}
    graph = imports()
    assert len(checks) > 10
    assert sorted((c, i) for c in checks for i in graph[c] if i in checks) == []
