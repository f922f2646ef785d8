"""Reading a run for its timeline: the three topics at a location, into a `Model`."""

from __future__ import annotations

from pathlib import Path

from logstore import LogError, open_log
from queue_worker.ops import read_ops
from queue_worker.proof.report import (
    ReportInputError,
    compacted_prefix,
    has_logs,
    missing_logs_text,
    read_claims,
)
from queue_worker.protocol.records import RecordDecodeError, TaskRecord, decode_task
from queue_worker.topics import TASKS_TOPIC
from supervisor.timeline.model import Model, build_model


def enqueue_times(location: str | Path) -> list[int]:
    """Each published task's enqueue time, by task id (-1 for a record that cannot be
    read). A data directory without a tasks log has none (nothing is created)."""
    return read_tasks(location)[0]


def read_tasks(location: str | Path) -> tuple[list[int], dict[int, str]]:
    """`enqueue_times`, and the function of each task by name (by task id)."""
    text = str(location)
    functions: dict[int, str] = {}
    if "://" not in text and not (Path(text) / f"{TASKS_TOPIC}.log").is_file():
        return [], functions
    times: list[int] = []
    compacted = compacted_prefix(location)  # ids go on from the tasks compaction removed
    with open_log(location, TASKS_TOPIC) as log:
        start = log.start
        if compacted is not None:
            times, start = [-1] * compacted[0].tasks, compacted[2]
        for entry in log.iter_from(start):
            try:
                record = decode_task(entry.data)
            except RecordDecodeError:
                times.append(-1)
                continue
            if isinstance(record, TaskRecord) and record.function is not None:
                functions[len(times)] = record.function
            times.append(record.enqueued_at if isinstance(record, TaskRecord) else -1)
    return times, functions


def load_model(location: str | Path) -> Model:
    """The model of the run at `location`; ReportInputError for no logs or a damaged one."""
    try:
        if not has_logs(location):
            raise ReportInputError(missing_logs_text(location))
        enqueued, functions = read_tasks(location)
        ops, _ = read_ops(location)
        return build_model(read_claims(location), enqueued, ops, functions=functions)
    except (LogError, OSError) as e:
        raise ReportInputError(str(e)) from e
