"""The demo traffic of `qw up --demo` and `qw enqueue --count N`: tasks for the demo handler
(queue_worker.worker.handlers:demo), numbered."""

from __future__ import annotations


def demo_payloads(first: int, count: int) -> list[dict[str, int]]:
    """The demo tasks' payloads: {"n": first}, {"n": first + 1}, …"""
    return [{"n": n} for n in range(first, first + count)]
