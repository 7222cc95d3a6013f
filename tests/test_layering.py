"""Imports point one way: core <- policies, workloads <- sim <- calibrate; no import cycles.

Inside sim/ and calibrate/ the packages point one way too (ALLOWED below; docs/design.md#layout
says the same in words). Every `import` statement counts, also those inside functions and under
TYPE_CHECKING: a deferred import still ties the two modules together.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# A package may import its own modules and those of packages of a lower rank only.
RANK = {"core": 0, "policies": 1, "workloads": 1, "sim": 2, "calibrate": 3}
# Inside sim/ and calibrate/: the packages each may import besides its own modules (and, through
# them, what those may). The top modules (sim.cli, sim.readme, calibrate.cli) may import any
# package of theirs; no package imports them.
ALLOWED = {
    "sim.pricing": set(),
    "sim.engine": {"sim.pricing"},
    "sim.runs": {"sim.engine"},
    "sim.figures": {"sim.runs"},
    "sim.plan": {"sim.figures"},
    "sim.validate": {"sim.figures"},
    "calibrate.kernels": set(),
    "calibrate.model": {"calibrate.kernels"},
    "calibrate.device": set(),
    "calibrate.executor": {"calibrate.model", "calibrate.device"},
    "calibrate.tables": {"calibrate.executor"},
    "calibrate.benches": {"calibrate.tables"},
    "calibrate.replay": {"calibrate.tables"},
    "calibrate.frontend": set(),
    "calibrate.scheduler": set(),
    "calibrate.carry": set(),
}
# The engine's loop and its parts: reached from outside sim.engine only through its entry point,
# sim.engine.core.run_engine (docs/design.md#layout; sim/engine/__init__.py names the hand-offs).
ENGINE_PARTS = {f"sim.engine.{m}" for m in ("scheduler", "step_plan", "step_prices", "decode_group", "decode_run",
                                            "frontend_steps", "frontend", "client", "request", "stream_seeds")}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in RANK for p in (REPO / pkg).rglob("*.py")}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module `name` refers to (a dotted name may end in a class or function)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_edges(modules: dict[str, Path]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for t in targets:
                if t.split(".")[0] in RANK and (target := _resolve(t, modules)) and target != mod:
                    edges[mod].add(target)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


@pytest.fixture(scope="module")
def modules() -> dict[str, Path]:
    return _modules()


@pytest.fixture(scope="module")
def edges(modules) -> dict[str, set[str]]:
    return import_edges(modules)


def test_no_upward_or_sideways_imports(edges):
    bad = [f"{m} imports {t}" for m, ts in edges.items() for t in sorted(ts)
           if (a := m.split(".")[0]) != (b := t.split(".")[0]) and RANK[b] >= RANK[a]]
    assert not bad, "imports against the layering:\n" + "\n".join(bad)


def test_no_import_cycles(edges):
    assert not _cycles(edges), f"modules that import each other: {_cycles(edges)}"


def test_the_checker_sees_deferred_upward_and_circular_imports(tmp_path):
    # The rules above must fail on the faults they exist for: an import inside a function,
    # one that points up, and two files that import each other.
    modules = {"core.a": tmp_path / "a.py", "sim.b": tmp_path / "b.py", "sim.c": tmp_path / "c.py"}
    modules["core.a"].write_text("def f():\n    from sim.b import g\n")
    modules["sim.b"].write_text("from sim import c\n")
    modules["sim.c"].write_text("import sim.b\n")
    e = import_edges(modules)
    assert e == {"core.a": {"sim.b"}, "sim.b": {"sim.c"}, "sim.c": {"sim.b"}}
    assert _cycles(e) == [["sim.b", "sim.c"]]


def unit(module: str) -> str:
    """The package of `module` that ALLOWED speaks of: `sim.engine` for sim.engine.core, the top
    package (`sim`) for its own top modules (sim.cli)."""
    parts = module.split(".")
    two = ".".join(parts[:2])
    return two if two in ALLOWED else parts[0]


def allowed(package: str) -> set[str]:
    """ALLOWED's packages for `package`, followed through: engine may import pricing, runs what engine may."""
    out: set[str] = set()
    todo = list(ALLOWED.get(package, ()))
    while todo:
        p = todo.pop()
        if p not in out:
            out.add(p)
            todo += ALLOWED[p]
    return out


def against_table(edges: dict[str, set[str]]) -> list[str]:
    """Imports between two packages of one top package that ALLOWED does not allow; importing a
    top module (sim.cli) from anywhere else is one."""
    return [f"{m} imports {t}" for m, ts in sorted(edges.items()) for t in sorted(ts)
            if m.split(".")[0] == t.split(".")[0] and (a := unit(m)) != (b := unit(t))
            and (b not in ALLOWED or a in ALLOWED and b not in allowed(a))]


def test_packages_inside_sim_and_calibrate_import_one_way(edges):
    bad = against_table(edges)
    assert not bad, "imports against the packages' table (ALLOWED):\n" + "\n".join(bad)


def test_every_package_of_sim_and_calibrate_is_in_the_table():
    packages = {p.parent.relative_to(REPO).as_posix().replace("/", ".") for top in ("sim", "calibrate")
                for p in (REPO / top).glob("*/__init__.py")}
    assert packages == set(ALLOWED), f"packages not in ALLOWED: {sorted(packages - set(ALLOWED))}; " \
                                     f"in ALLOWED but gone: {sorted(set(ALLOWED) - packages)}"


def test_the_table_points_one_way():
    assert all(p not in allowed(p) for p in ALLOWED), "ALLOWED has a cycle"
    assert all(set(v) <= set(ALLOWED) for v in ALLOWED.values())


def test_the_package_checker_sees_sideways_and_upward_imports():
    # engine -> runs points up; plan -> validate sideways; runs -> pricing through engine is fine;
    # a package importing a top module (sim.cli) is against the table too.
    edges = {"sim.engine.core": {"sim.runs.run"}, "sim.plan.cli": {"sim.validate.cli", "sim.pricing.latency"},
             "sim.runs.run": {"sim.pricing.latency"}, "sim.figures.cli": {"sim.cli"}}
    assert against_table(edges) == ["sim.engine.core imports sim.runs.run", "sim.figures.cli imports sim.cli",
                                    "sim.plan.cli imports sim.validate.cli"]


def engine_parts_from_outside(edges: dict[str, set[str]]) -> list[str]:
    return [f"{m} imports {t}" for m, ts in sorted(edges.items()) for t in sorted(ts)
            if t in ENGINE_PARTS and unit(m) != "sim.engine"]


def test_the_engine_is_entered_through_run_engine(edges, modules):
    assert ENGINE_PARTS <= set(modules), f"ENGINE_PARTS names modules that are gone: {ENGINE_PARTS - set(modules)}"
    bad = engine_parts_from_outside(edges)
    assert not bad, "the engine's parts imported from outside it (use sim.engine.core.run_engine):\n" + "\n".join(bad)


def test_the_engine_checker_sees_a_part_imported_from_outside():
    edges = {"sim.runs.run": {"sim.engine.core", "sim.engine.scheduler"}, "sim.engine.core": {"sim.engine.scheduler"},
             "calibrate.replay.run": {"sim.engine.step_trace"}}
    assert engine_parts_from_outside(edges) == ["sim.runs.run imports sim.engine.scheduler"]
