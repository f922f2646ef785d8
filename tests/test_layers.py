"""The layers of the code, as docs/architecture.md draws them, held against every import.

Each layer may import the layers below it and itself, never one above: the rule is checked
for every `import` and `from … import` in the product code, at the top of a module or inside
a function (a local import is still an arrow a reader follows); an import under
`if TYPE_CHECKING:` names a type for the checker and is not counted. Names imported from a
package's face (`from logstore import LogError`) count as imports of the module the face
took them from.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("logstore", "queue_worker", "supervisor")

#: lowest first; a module belongs to the longest prefix that names it
LAYERS: list[tuple[str, ...]] = [
    # logstore: the byte-log interface, then one backend each, then the face that picks one
    ("logstore.base", "logstore.location", "logstore.locking"),
    ("logstore.file.framing",),
    ("logstore.identity", "logstore.memory"),
    ("logstore.file", "logstore.redis"),
    ("logstore.blob", "logstore"),
    # queue_worker: small helpers, the protocol as values, the topics, then what uses them
    (
        "queue_worker.errors",
        "queue_worker.times",
        "queue_worker.names",
        "queue_worker.values",
        "queue_worker.percentile",
        "queue_worker.waiting",
    ),
    ("queue_worker.protocol",),
    ("queue_worker.topics", "queue_worker.ops", "queue_worker.partition_layout"),
    ("queue_worker.history",),
    ("queue_worker.worker",),
    ("queue_worker.redis",),
    ("queue_worker.opening", "queue_worker.process", "queue_worker.fleet"),
    ("queue_worker.proof",),
    ("queue_worker.compaction",),
    # the face's objects: enqueueing, tasks by name, their results, periodic tasks
    (
        "queue_worker.producer",
        "queue_worker.tasks",
        "queue_worker.results",
        "queue_worker.periodic",
    ),
    ("queue_worker.partitions",),
    ("queue_worker",),
    # supervisor: shared text and options, the running supervisor, its screens, the commands
    (
        "supervisor.console",
        "supervisor.options",
        "supervisor.report_text",
        "supervisor.story_text",
        "supervisor.task_history",
        "supervisor.unfenced_text",
        "supervisor.width",
    ),
    ("supervisor.run",),
    ("supervisor.tui",),
    ("supervisor.partitioned", "supervisor.timeline", "supervisor.replay"),
    ("supervisor.demos", "supervisor.http_api", "supervisor.http_metrics", "supervisor.web"),
    ("supervisor.cli", "supervisor"),
]


def _layer_of(module: str) -> int:
    best, found = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), index
    assert found >= 0, f"{module} is in no layer: add it to LAYERS (and docs/architecture.md)"
    return found


def _modules() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            yield name, path


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _face_homes(package: str) -> dict[str, str]:
    """Where the names a package's __init__ imports at its top come from."""
    init = ROOT.joinpath(*package.split(".")) / "__init__.py"
    homes: dict[str, str] = {}
    if init.exists():
        for node in ast.parse(init.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    homes[alias.asname or alias.name] = node.module
    return homes


def _is_type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, but not inside `if TYPE_CHECKING:` (names for the type checker only)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if not _is_type_checking(node):
            stack.extend(ast.iter_child_nodes(node))


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    for node in _nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in PACKAGES:
                continue
            homes = _face_homes(node.module)
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                yield node.lineno, sub if _is_module(sub) else homes.get(alias.name, node.module)


def _arrows() -> Iterator[tuple[str, int, str]]:
    for name, path in _modules():
        for line, target in _imports(path):
            if target.split(".")[0] in PACKAGES and target != name:
                yield name, line, target


def test_every_module_is_in_a_layer() -> None:
    for name, _ in _modules():
        _layer_of(name)


def test_no_import_runs_up_a_layer() -> None:
    upward = [
        f"{source}:{line} imports {target}"
        for source, line, target in _arrows()
        if _layer_of(target) > _layer_of(source)
    ]
    assert upward == []


def test_the_imports_have_no_circle() -> None:
    graph: dict[str, set[str]] = {}
    for source, _, target in _arrows():
        graph.setdefault(source, set()).add(target)
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        for target in sorted(graph.get(module, ())):
            circle = visit(target, [*path, module])
            if circle is not None:
                return circle
        done.add(module)
        return None

    for module in sorted(graph):
        circle = visit(module, [])
        assert circle is None, " -> ".join(circle)
