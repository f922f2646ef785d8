"""The two small records a fold checkpoint names (`queue_worker.checkpoint`), in a module of
their own without ``from __future__ import annotations``: typing.NamedTuple compiles each
field's annotation when it is a string, and the first compile() of a process costs `qw
status`, which loads checkpoints, about a tenth of `python -c pass`
(tests/test_startup_imports.py)."""

from typing import NamedTuple


class Removed(NamedTuple):
    """A segment compaction removed: its positions and the crc32 of its bytes."""

    base: int
    end: int
    crc: int


class RecordSeen(NamedTuple):
    """Which record a checkpoint saw at a position: enough to tell if it is still there."""

    position: int
    next: int
    length: int
    crc: int
