"""`qw tail` on a partitioned queue: the last records of every partition's topic, in time
order, each line tagged ``p<k>`` and its task named ``k:id``.

Each partition's claims are followed by their own fold (the verdicts are that partition's),
from its first record, as `qw tail` does for a queue. The lines are merged by the records'
own times (the writer's clock; the server's on Redis): partitions have no order between
them, so the merge is by time, not by position. With --follow, each partition is polled in
turn and what arrived is printed in time order.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Final

from logstore import Log, LogError
from supervisor.options import fail
from supervisor.partitioned.names import tagged
from supervisor.width import echo

#: how long --follow waits on each partition in a round (at most a second a round)
FOLLOW_WAIT_S: Final = 1.0


def tail(location: str, topic: str, lines: int, follow: bool) -> bool:
    """Print the tail of the partitioned queue at `location` (False: it has no partitions,
    and `qw tail` goes on as for any queue)."""
    from supervisor.cli import partitioned_commands as partitioned_cli

    manifest = partitioned_cli.manifest_at(location, create=False)
    if manifest is None:
        return False
    from queue_worker.partitions.queue import open_partition_topic
    from queue_worker.proof.report import has_logs
    from queue_worker.topics import open_topic

    logs: list[tuple[int, Log]] = []
    try:
        for k in range(manifest.count):
            where = open_partition_topic(location, manifest, k)
            if has_logs(where):  # (on Redis a partition no task went to has none yet)
                logs.append((k, open_topic(where, topic, read_only=True)))
        _print(logs, topic, lines, follow)
    except KeyboardInterrupt:
        pass  # Ctrl-C ends --follow: that is how it is meant to stop
    except LogError as e:
        fail(str(e))
    finally:
        for _, log in logs:
            log.close()
    return True


def _print(logs: list[tuple[int, Log]], topic: str, lines: int, follow: bool) -> None:
    from queue_worker.topics import CLAIMS_TOPIC
    from supervisor.cli.record_lines import ClaimsPrinter, TasksPrinter

    printers = [ClaimsPrinter() if topic == CLAIMS_TOPIC else TasksPrinter() for _ in logs]
    positions = [log.start for _, log in logs]

    def read_on(i: int) -> list[tuple[int, int, str]]:
        """(time, partition, line) of what partition i's topic holds after its position."""
        k, log = logs[i]
        printer, out = printers[i], []
        for entry in log.iter_from(positions[i]):
            text = printer.line(entry)
            if topic != CLAIMS_TOPIC:  # "#17  @…": task 17 of partition k
                text = f"#{k}:{text[1:]}"
            out.append(
                (printer.at or 0, k, tagged(text, k) if topic == CLAIMS_TOPIC else f"p{k} {text}")
            )
            positions[i] = entry.next
        return out

    recent: deque[tuple[int, int, str]] = deque(maxlen=lines)
    for line in heapq.merge(*(read_on(i) for i in range(len(logs)))):
        recent.append(line)
    for _, _, text in recent:
        echo(text)
    while follow:
        new: list[tuple[int, int, str]] = []
        for i, (_, log) in enumerate(logs):
            if log.wait(positions[i], FOLLOW_WAIT_S / max(1, len(logs))):
                new.extend(read_on(i))
        for _, _, text in sorted(new):
            echo(text)


__all__ = ["tail"]
