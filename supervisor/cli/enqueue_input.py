"""What `qw enqueue` accepts: payloads from --payload/--count or --file, within bounds.

`qw enqueue` writes all its tasks in one append or none, so everything is checked first:
each bad input is one line naming the value and what was expected (exit 2), and nothing is
written. The bounds keep one run within what a log and a laptop take: a JSON value nested
deeper than `MAX_PAYLOAD_DEPTH` (json would raise RecursionError, msgpack refuses 512),
more than `MAX_ENQUEUE` tasks or `MAX_ENQUEUE_BYTES` of records (every record is built in
memory before the one append; the Redis log refuses a bigger batch too), a file larger
than that.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from queue_worker.names import printable
from queue_worker.protocol.records import RecordEncodeError, TaskRecord, encode
from supervisor.options import bad, fail

MAX_ENQUEUE: Final = 1_000_000
MAX_ENQUEUE_BYTES: Final = 256 * 1024 * 1024
MAX_PAYLOAD_DEPTH: Final = 256
#: a file is read whole: more than this many bytes of JSON lines is refused unread
MAX_FILE_BYTES: Final = MAX_ENQUEUE_BYTES


class Short(str):
    """A value quoted in a message: cut short, printable (a payload may be megabytes)."""

    def __repr__(self) -> str:
        text = str(self)
        return printable(repr(text if len(text) <= 60 else text[:59] + "…"))


class PayloadError(ValueError):
    """Text that is not one acceptable JSON payload; the message says what is wrong."""


def depth(value: Any) -> int:
    """How deep arrays and maps nest in `value` (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if isinstance(item, list):
            stack.extend((x, level + 1) for x in item)
        elif isinstance(item, dict):
            stack.extend((x, level + 1) for x in item.values())
    return deepest


def parse_payload(text: str) -> Any:
    """One JSON value, nested at most MAX_PAYLOAD_DEPTH deep. Raises PayloadError."""
    import json  # (for --payload and --file only: ~1 ms of `qw enqueue --count N`)

    too_deep = f"JSON nested deeper than {MAX_PAYLOAD_DEPTH} levels"
    try:
        value = json.loads(text)
    except RecursionError:
        raise PayloadError(too_deep) from None
    except ValueError as e:
        raise PayloadError(f"not JSON ({e})") from None
    if depth(value) > MAX_PAYLOAD_DEPTH:
        raise PayloadError(too_deep)
    return value


def record_size(value: Any, where: str) -> int:
    """The bytes of the TASK record that carries `value` (refused if it cannot be one)."""
    try:
        return len(encode(TaskRecord(value, 0)))
    except RecordEncodeError as e:
        fail(f"{where}: {e}")


def repeated(text: str, count: int) -> list[Any]:
    """--payload TEXT --count N: N tasks of one payload."""
    try:
        value = parse_payload(text)
    except PayloadError as e:
        expected = f"one JSON value nested at most {MAX_PAYLOAD_DEPTH} deep ({e})"
        bad("--payload", Short(text), expected)
    size = record_size(value, "--payload")
    if size * count > MAX_ENQUEUE_BYTES:
        fail(
            f"--count {count} of a {size}-byte task record is {size * count} bytes; expected "
            f"at most {MAX_ENQUEUE_BYTES} bytes in one enqueue (enqueue in several runs)"
        )
    return [value] * count


def from_file(path: Path) -> list[Any]:
    """--file: one JSON payload per line (blank lines skipped)."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            bad("--file", str(path), f"a file of at most {MAX_FILE_BYTES} bytes (it has {size})")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        bad("--file", str(path), f"a readable UTF-8 file ({e})")
    payloads = []
    total = 0
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue  # blank lines separate nothing; skipping them is what people expect
        where = f"{path} line {number}"
        try:
            value = parse_payload(line)
        except PayloadError as e:
            fail(f"{where}: {e}; expected one JSON value per line")
        total += record_size(value, where)
        payloads.append(value)
        if len(payloads) > MAX_ENQUEUE or total > MAX_ENQUEUE_BYTES:
            fail(
                f"{path}: more than {MAX_ENQUEUE} tasks or {MAX_ENQUEUE_BYTES} bytes of task "
                f"records by line {number}; expected at most that in one enqueue (split the file)"
            )
    if not payloads:
        fail(f"{path} holds no tasks; expected one JSON payload per line")
    return payloads
