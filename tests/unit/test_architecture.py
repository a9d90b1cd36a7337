"""The import graph of ``src/herald``: no circle, and every import runs down the floors.

``FLOORS`` is docs/architecture.md's order written as data, lowest first. A module
may import modules on its own floor or below, never above; a module no floor
names fails the test, so a new module is placed on purpose. Imports inside
functions count too: a lazy import is still an arrow.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

FLOORS: list[tuple[str, ...]] = [
    # Plain data and helpers that know nothing of Herald's moving parts.
    (
        "herald",
        "herald.__init__",
        "herald.errors",
        "herald.timeutil",
        "herald.ids",
        "herald.model",
        "herald.logs",
        "herald.systemd",
        "herald.gctune",
        "herald.collectors",
        "herald.metrics",
        "herald.tracing",
        "herald.audit",
        "herald.deadlines",
    ),
    # Rules: the settings, the retry schedule, secrets, signing, matching, egress, row
    # parsing, what recorded attempts signal, the dispatcher's slot arithmetic, flow control.
    (
        "herald.config",
        "herald.retry",
        "herald.crypto",
        "herald.signing",
        "herald.match",
        "herald.egress",
        "herald.ingest",
        "herald.fields",
        "herald.signals",
        "herald.slots",
        "herald.payload_filter",
        "herald.eventschema",
        "herald.flow",
        "herald.ordering",
    ),
    # The edges of the engine: the database, the destinations, producers' databases.
    ("herald.store", "herald.adapters", "herald.sourcedb"),
    # What the engine is made of.
    (
        "herald.catalog",
        "herald.views",
        "herald.attempt",
        "herald.recorder",
        "herald.claims",
        "herald.handover",
        "herald.wire",
    ),
    # The engine's loops, the operations people call (the service and its rooms), and
    # who may call them (access).
    (
        "herald.dispatch",
        "herald.outbox",
        "herald.sources",
        "herald.service",
        "herald.events",
        "herald.pings",
        "herald.replays",
        "herald.overview",
        "herald.replayer",
        "herald.eventtypes",
        "herald.access",
    ),
    # Faces and wiring.
    ("herald.wiring", "herald.workers", "herald.api", "herald.console"),
    ("herald.app",),
    ("herald.cli", "herald.__main__"),
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted((SRC / "herald").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(module: str, path: Path, known: set[str]) -> Iterator[str]:
    """The herald modules that ``module`` imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from pkg import mod`` names a module; ``from mod import name`` does not.
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module and name.startswith("herald"):
                yield name


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {m: set(_imports(m, p, known)) for m, p in modules.items()}


def _floor(module: str) -> int | None:
    best: tuple[int, int] | None = None
    for level, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            covers = module == prefix or module.startswith(prefix + ".")
            if covers and (best is None or len(prefix) > best[1]):
                best = (level, len(prefix))
    return None if best is None else best[0]


def test_every_module_stands_on_a_floor() -> None:
    unplaced = [m for m in _modules() if _floor(m) is None]
    assert not unplaced, f"place these modules in FLOORS (and docs/architecture.md): {unplaced}"


def test_no_import_runs_up_a_floor() -> None:
    upward = []
    for module, targets in _graph().items():
        here = _floor(module)
        for target in targets:
            there = _floor(target)
            if here is not None and there is not None and there > here:
                upward.append(f"{module} (floor {here}) -> {target} (floor {there})")
    assert not upward, "\n".join(sorted(upward))


def test_no_import_circle() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                circles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not circles, "\n".join(" -> ".join(c) for c in circles)


@pytest.mark.parametrize("module", ["herald.store", "herald.adapters"])
def test_the_edges_never_import_the_engine(module: str) -> None:
    """The store and the adapters sit below everything that moves deliveries."""
    engine = {"herald.outbox", "herald.dispatch", "herald.service", "herald.app", "herald.cli"}
    graph = _graph()
    offenders = {
        f"{m} -> {t}"
        for m, targets in graph.items()
        if m == module or m.startswith(module + ".")
        for t in targets
        if any(t == e or t.startswith(e + ".") for e in engine)
    }
    assert not offenders, sorted(offenders)


FACES = ("herald.api", "herald.console", "herald.cli")
"""What callers meet: the REST API, the console and the portal, the command line."""

ENGINE = (
    "herald.outbox",
    "herald.sources",
    "herald.dispatch",
    "herald.slots",
    "herald.flow",
    "herald.claims",
    "herald.handover",
    "herald.attempt",
    "herald.recorder",
    "herald.catalog",
    "herald.workers",
    "herald.wire",
    "herald.replayer",
)
"""What moves deliveries: the relay, the dispatcher and its parts, the attempt
processes, the background replays."""


def _offenders(sources: tuple[str, ...], targets: tuple[str, ...]) -> list[str]:
    def within(module: str, names: tuple[str, ...]) -> bool:
        return any(module == n or module.startswith(n + ".") for n in names)

    return sorted(
        f"{m} -> {t}"
        for m, imported in _graph().items()
        if within(m, sources)
        for t in imported
        if within(t, targets)
    )


def test_no_face_imports_the_store() -> None:
    """A face reaches the database only through the service and access (herald.access),
    which the floors alone allow it to skip: the store is below both."""
    assert not _offenders(FACES, ("herald.store",))


def test_the_engine_never_imports_wiring() -> None:
    """Wiring builds the engine's parts and hands them in; the engine never builds its
    own (the attempt processes are given theirs by the command that starts them)."""
    assert not _offenders(ENGINE, ("herald.wiring",))
