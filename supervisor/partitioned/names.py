"""How what one partition says reads on the whole queue's screens: tagged ``p<k>``, with
each task named ``k:id`` (its name on a partitioned queue, `queue_worker.partition_layout`)."""

from __future__ import annotations

import re

__all__ = ["tagged"]

#: "task 17", "tasks 17, 18": a partition's task ids in what is said about it
_TASKS = re.compile(r"\b(tasks? )(\d+(?:, \d+)*)\b")


def tagged(text: str, partition: int) -> str:
    """``p2`` first, and each ``task 17`` named ``task 2:17``."""
    named = _TASKS.sub(
        lambda m: m.group(1) + ", ".join(f"{partition}:{t}" for t in m.group(2).split(", ")),
        text,
    )
    return f"p{partition} {named}"
