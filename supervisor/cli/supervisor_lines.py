"""`qw status`'s lines about the supervisors running on a queue, from their status files
(`supervisor.run.run_files.read_status_files`): one wording for a queue and a partitioned one.

    supervisors  1 running
      pid 4711  8 workers alive  4 partitions  http 127.0.0.1:8321  draining
      pid 4712  2 members alive                                       (qw up --rebalance)
      pid 4713  1 worker alive  draining
        stopping on a log: w0·4714: …/claims.log: damaged at offset 1234 …

A `qw up --partitions P` is one process running one supervisor per partition, each with
its own status file (in ``p<k>/run``): they are one supervisor to the person who started
it, so files of one pid are one line, their workers added up and the partitions counted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from queue_worker.names import printable

__all__ = ["supervisor_lines"]


def supervisor_lines(statuses: Sequence[Mapping[str, Any]]) -> list[str]:
    """How many supervisor processes run, then a line for each (in the order first seen)."""
    by_pid: dict[object, list[Mapping[str, Any]]] = {}
    for status in statuses:
        by_pid.setdefault(status.get("pid"), []).append(status)
    lines = [f"supervisors  {len(by_pid)} running"]
    for pid, files in by_pid.items():
        alive = sum(1 for s in files for w in s.get("workers", []) if w.get("alive"))
        # (the processes of `qw up --rebalance` are members, each working its partitions)
        noun = "member" if any(s.get("rebalance") for s in files) else "worker"
        line = f"  pid {pid}  {alive} {noun}{'s' * (alive != 1)} alive"
        if len(files) > 1:
            line += f"  {len(files)} partitions"
        http = next((s["http"] for s in files if s.get("http")), None)
        if http:
            line += f"  http {http}"
        if any(s.get("draining") for s in files):
            line += "  draining"
        lines.append(line)
        for failure in (s["log_failure"] for s in files if isinstance(s.get("log_failure"), str)):
            lines.append(f"    stopping on a log: {printable(failure)}")
    return lines
