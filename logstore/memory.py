"""An in-memory log: the same interface as the file log, for fast tests in one process.

Positions are record indexes. Several handles may share one `MemoryLog` from several
threads; it is not shared between processes (use the file log for that).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from logstore.base import Entry, Log, LogClosedError, RecordTooLargeError

DEFAULT_MAX_RECORD = 16 * 1024 * 1024


class MemoryLog(Log):
    """A list of records guarded by a condition variable."""

    def __init__(self, name: str = "memory", max_record: int = DEFAULT_MAX_RECORD) -> None:
        self.name = f"memory:{name}"
        self.max_record = max_record
        self._records: list[bytes] = []
        self._changed = threading.Condition()
        self._closed = False

    def _check(self, records: Sequence[bytes]) -> None:
        if self._closed:
            raise LogClosedError(f"{self.name} is closed")
        for data in records:
            if len(data) > self.max_record:
                raise RecordTooLargeError(len(data), self.max_record)

    def append(self, data: bytes, *, durable: bool = False) -> int:
        return self.append_many([data], durable=durable)[0]

    def append_many(self, records: Sequence[bytes], *, durable: bool = False) -> list[int]:
        self._check(records)
        with self._changed:
            first = len(self._records)
            self._records.extend(bytes(r) for r in records)
            self._changed.notify_all()
        return list(range(first, first + len(records)))

    def read(self, position: int, max_records: int | None = None) -> list[Entry]:
        if self._closed:
            raise LogClosedError(f"{self.name} is closed")
        if position < 0:
            raise ValueError(f"position {position} is negative; expected 0 or more")
        with self._changed:
            stop = len(self._records)
            if max_records is not None:
                stop = min(stop, position + max_records)
            chunk = self._records[position:stop]
        return [Entry(position + i, position + i + 1, data) for i, data in enumerate(chunk)]

    def wait(self, position: int, timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(
                lambda: self._closed or len(self._records) > position, timeout
            )

    @property
    def start(self) -> int:
        return 0

    def end(self) -> int:
        with self._changed:
            return len(self._records)

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
