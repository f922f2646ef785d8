"""A worker's CPU per task split by part, for `bench.drain_profile --parts`.

Wraps the functions of each part of the per-task loop so that each call charges its own
main-thread CPU (`time.thread_time_ns`), less that of the wrapped calls inside it, to its
part; what no wrapper covers is "the loop itself" (the step's own code, the claim/verdict
bookkeeping, stats calls not wrapped). Run inside the worker process before it starts. Each
wrapper adds ~1 µs of its own to the part that calls it: compare parts, do not add them up
to more than they are.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Any

from logstore.file.log import FileLog
from queue_worker.topics import ClaimsFollower, TaskIndex
from queue_worker.worker import attempt as attempt_module
from queue_worker.worker import loop as worker_module
from queue_worker.worker.lease import LeaseKeeper
from queue_worker.worker.publisher import SnapshotPublisher
from queue_worker.worker.recorder import StatsRecorder
from queue_worker.worker.watchdog import TimeLimits, _Running

_spent: dict[str, int] = {}
_calls: dict[str, int] = {}
_children: dict[str, int] = {}  # wrapped calls made inside each part's calls ("": the loop)
_stack: list[list[Any]] = []  # per open wrapped call: [its part, CPU of the calls inside it]
_main = threading.main_thread()


def _wrap(label: str, function: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not _main:
            return function(*args, **kwargs)
        parent = _stack[-1][0] if _stack else ""
        _children[parent] = _children.get(parent, 0) + 1
        started = time.thread_time_ns()
        _stack.append([label, 0])
        try:
            return function(*args, **kwargs)
        finally:
            inner = _stack.pop()[1]
            took = time.thread_time_ns() - started
            _spent[label] = _spent.get(label, 0) + took - inner
            _calls[label] = _calls.get(label, 0) + 1
            if _stack:
                _stack[-1][1] += took

    return timed


def _calibrate(n: int = 5000) -> tuple[float, float]:
    """What one wrapper adds (ns): to the part it times, and to the part that calls it."""

    def leaf() -> None:
        return None

    timed_leaf = _wrap("_leaf", leaf)

    def bare() -> None:
        for _ in range(n):
            leaf()

    def wrapped() -> None:
        for _ in range(n):
            timed_leaf()

    started = time.thread_time_ns()
    bare()
    bare_ns = time.thread_time_ns() - started
    _wrap("_parent", wrapped)()
    inner = _spent.pop("_leaf") / n
    outer = max(0.0, (_spent.pop("_parent") - bare_ns) / n)
    for name in ("_leaf", "_parent"):
        _calls.pop(name, None)
        _children.pop(name, None)
    _children[""] -= 1  # the calibration's own parent call
    return inner, outer


#: part -> (owner, attribute) of every function charged to it
PARTS: dict[str, list[tuple[Any, str]]] = {
    "tasks log: index new tasks, load the task": [(TaskIndex, "catch_up"), (TaskIndex, "load")],
    "claims log: read (file, frames, checksums)": [(FileLog, "read")],
    "claims log: append under the lock": [(FileLog, "append_many")],
    "fold: others' records (decode + apply)": [(ClaimsFollower, "fold_entries")],
    "fold: settle our records (chain, apply)": [(ClaimsFollower, "settle_batch")],
    "encode our records": [(worker_module, "encode")],
    "pick the next task": [(worker_module.Worker, "pick")],
    "lease keeper: build, hand over, take back": [
        (LeaseKeeper, "__init__"),
        (LeaseKeeper, "start"),
        (LeaseKeeper, "stop"),
    ],
    "time limits: arm, disarm": [
        (TimeLimits, "running"),
        (_Running, "__enter__"),
        (_Running, "__exit__"),
    ],
    "handler (no-op) and its context": [
        (attempt_module, "run_task"),
        (attempt_module, "TaskContext"),
    ],
    "stats events and publish calls": [
        (StatsRecorder, name)
        for name in (
            "state",
            "folded",
            "claimed",
            "working",
            "off_task",
            "finished",
            "log_recovered",
        )
    ]
    + [(SnapshotPublisher, "publish")],
    "checkpoint save (slot 0, at exit)": [
        (worker_module.Worker, "_save_checkpoint"),
        (worker_module.Worker, "_after_step"),
    ],
}


def install(out: str) -> None:
    """Wrap every part's functions, and write the figures to `out` (JSON) at exit."""
    for label, places in PARTS.items():
        for owner, name in places:
            setattr(owner, name, _wrap(label, getattr(owner, name)))
    run = worker_module.Worker.run

    def measured_run(self: Any, stop: threading.Event | None = None) -> str:
        started, cpu0 = time.thread_time_ns(), time.process_time_ns()
        try:
            return run(self, stop)
        finally:
            main = time.thread_time_ns() - started
            process = time.process_time_ns() - cpu0
            inner, outer = _calibrate()
            figures = {
                "wrapper_inner_ns": inner,
                "wrapper_outer_ns": outer,
                "children": _children,
                "main_thread_ns": main,
                "process_ns": process,
                "finished": self.stats.finished,
                "spent_ns": _spent,
                "calls": _calls,
            }
            Path(out).write_text(json.dumps(figures))

    worker_module.Worker.run = measured_run  # type: ignore[method-assign]
    _ = os


def summary(path: Path) -> str:
    """The parts as µs of CPU per task done by the measured worker."""
    figures = json.loads(path.read_text())
    tasks = max(1, figures["finished"])
    inner, outer = figures["wrapper_inner_ns"], figures["wrapper_outer_ns"]
    calls, children = figures["calls"], figures["children"]
    # each part less what its own wrappers and those of the calls inside it added
    spent = {
        label: ns - calls[label] * inner - children.get(label, 0) * outer
        for label, ns in figures["spent_ns"].items()
    }
    overhead = sum(calls.values()) * inner + sum(children.values()) * outer
    main = figures["main_thread_ns"] - overhead
    us = 1e-3 / tasks
    lines = [
        f"the measured worker's {figures['finished']} tasks, µs of CPU a task (its loop), "
        f"less the wrappers' own cost ({inner / 1e3:.1f} + {outer / 1e3:.1f} µs a call, "
        f"{overhead * us:.0f} µs a task, measured in the process at exit):"
    ]
    for label, ns in sorted(spent.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {ns * us:6.1f}  {label} ({calls[label] / tasks:.1f} calls a task)")
    rest = main - sum(spent.values())
    lines.append(f"  {rest * us:6.1f}  the loop itself (step, verdicts, bookkeeping)")
    lines.append(f"  {main * us:6.1f}  main thread in all")
    other = figures["process_ns"] - figures["main_thread_ns"]
    lines.append(f"  {other * us:6.1f}  the other threads (stats writer, lease, watchdogs)")
    return "\n".join(lines)
