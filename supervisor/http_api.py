"""The stats endpoint of `qw up --http HOST:PORT`: a stdlib HTTP server in a daemon thread.

    /health      "ok"; 503 and one line per worker whose log is failing (`log_error`: a
                 full disk, a server out of reach), naming the file and the error
    /stats       JSON: the supervisor, the queue, and one object per worker slot with the
                 original's field names (attempts, won, lost, finished, timeouts, current,
                 knownTasks, consumedUpTo, doneTasks, heldByAnyone, claimLatencyMicros
                 {p50, p90, p99, samples}) and ours after them
    /task/{id}   JSON: done, heldBy, heldAt (ms), known, and ours (dead, state, attempts,
                 function (a task by name's; null for a payload task), after (the tasks
                 it waits for), payload, result, and the history of its records with their verdicts;
                 heldByLabel, leaseExpired by this machine's clock); 404 for an id that no
                 record names, 400 for one that is no task id (0 … 2^63 − 1)
    /metrics     the Prometheus text exposition format (version 0.0.4)
    /            the live dashboard in a browser; /events its frames, /timeline the run
                 so far; with --http-control, POST /control/kill and /control/pause
                 (`supervisor.web.routes`)

On a partitioned queue (`supervisor.partitioned.view`): /stats adds ``partitions`` (each
partition's counts; ``queue`` is their sum) and ``orphans``, each worker has its
``partition``; /metrics adds ``qw_partition_tasks`` and ``qw_orphans`` per partition and a
``partition`` label on every worker metric; a task is /task/K:ID (task ID of partition K).

Every answer is built from `snapshot()` and `task_info()`, which copy what the supervisor's
watcher gathered, except /task/{id}: its history is read from the logs (a replay, as `qw task`
does; `supervisor.task_history`). No request touches a worker.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from logstore import LogError, space_problem
from queue_worker.names import worker_label
from queue_worker.protocol.records import MAX_TASK_ID
from supervisor.http_metrics import PROMETHEUS_CONTENT_TYPE, metrics_text
from supervisor.run.model import SupervisorSnapshot, WorkerView
from supervisor.run.monitor import TaskInfo
from supervisor.task_history import TaskHistory, read_task_history
from supervisor.web.control import MAX_BODY as MAX_POST_BODY
from supervisor.web.control import TOKEN_HEADER, ControlDesk
from supervisor.web.routes import WebRoutes

__all__ = [
    "PROMETHEUS_CONTENT_TYPE",
    "StatsServer",
    "StatsSource",
    "is_loopback",
    "metrics_text",
    "parse_address",
    "parse_task_id",
    "stats_json",
    "task_json",
    "worker_json",
]


class StatsSource(Protocol):
    def snapshot(self) -> SupervisorSnapshot: ...

    def task_info(self, task: int) -> TaskInfo | None: ...


def parse_address(text: str) -> tuple[str, int]:
    """ "PORT", ":PORT", "HOST:PORT" or "[IPv6]:PORT" → (host, port); loopback by default.
    Raises ValueError naming what was expected."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = "", text
    host = host.strip("[]") or "127.0.0.1"
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"{text!r} has no valid port; expected HOST:PORT with a port 0-65535")
    return host, int(port_text)


def parse_task_id(text: str) -> int | None:
    """The task id in /task/ID, or None: ASCII digits only (int() takes "٣" and refuses
    "²", both of which isdigit() passes), and no more than 19 of them (int() refuses
    more than 4300 digits with a ValueError)."""
    if not (text.isascii() and text.isdigit() and len(text) <= len(str(MAX_TASK_ID))):
        return None
    task = int(text)
    return task if task <= MAX_TASK_ID else None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost: it may resolve anywhere


# -- the JSON bodies -------------------------------------------------------------------------


def worker_json(w: WorkerView) -> dict[str, Any]:
    """One worker: the original's field names first, then ours."""
    s = w.stats
    latency = s.claim_latency_micros
    return {
        "name": w.name,
        "attempts": s.attempts,
        "won": s.won,
        "lost": s.lost_total,
        "finished": s.finished,
        "timeouts": s.timeouts,
        "current": s.current_task,
        "knownTasks": s.known_tasks,
        "consumedUpTo": s.consumed_up_to,
        "doneTasks": s.done_tasks,
        "heldByAnyone": s.held_by_anyone,
        "claimLatencyMicros": {
            "p50": latency.p50,
            "p90": latency.p90,
            "p99": latency.p99,
            "samples": latency.samples,
        },
        # ours
        "slot": w.slot,
        "partition": w.partition,
        "worker": w.worker_id,
        "label": None if w.worker_id is None else worker_label(w.worker_id),
        "pid": w.pid,
        "state": w.state.value,
        "currentFunction": s.current_function,  # the current task's, when it is by name
        "lostByVerdict": dict(s.lost),
        "indexedTasks": s.indexed_tasks,  # task positions its index holds: the live tasks
        "takeovers": s.takeovers,
        "stale": s.stale,
        "failed": s.failed,
        "renewals": s.renewals,
        "leasesLost": s.leases_lost,
        "cpuPercent": w.cpu_percent,
        "rssBytes": w.rss_bytes,
        "restarts": w.restarts,
        "exitCode": w.exit_code,
        "diedAt": w.died_at,
        "logError": s.log_error,
    }


def health_problems(snap: SupervisorSnapshot) -> list[str]:
    """Why the run is not healthy: each live worker whose log is failing (its `log_error`:
    a full disk, a server out of reach), one line each; empty when healthy."""
    problems = [
        f"{w.name}: {w.stats.log_error}" for w in snap.workers if not w.ended and w.stats.log_error
    ]
    full = space_problem(snap.location)  # a full disk stops the snapshots too: ask it
    return [*problems, full] if full else problems


def stats_json(snap: SupervisorSnapshot) -> dict[str, Any]:
    body = {
        "location": snap.location,
        "startedAt": snap.started_at,
        "draining": snap.draining,
        "queue": asdict(snap.queue),
        "workers": [worker_json(w) for w in snap.workers],
    }
    if snap.partitions:  # a partitioned queue: `queue` is their sum
        body["partitions"] = [{"partition": k, **asdict(q)} for k, q in enumerate(snap.partitions)]
        body["orphans"] = [
            {
                "task": o.name,
                "holder": o.holder_id,
                "holderLabel": o.holder,
                "heir": o.heir,
                "leaseExpiry": o.lease_expiry,
                "takenAt": o.taken_at,
            }
            for o in snap.orphans
        ]
    return body


def task_json(
    info: TaskInfo, history: TaskHistory | None = None, now_us: int | None = None
) -> dict[str, Any]:
    """The fold's view of the task now and, with `history`, its whole story from the logs
    (the live fold forgets a finished task's attempts; the history has them).

    `leaseExpired`: the holder's lease has run out by `now_us` (default: this machine's
    clock). It is what a reader sees, not a verdict: the task stays held until a claim
    takes it over."""
    holder = info.holder
    now = time.time_ns() // 1000 if now_us is None else now_us
    body = {
        "task": info.task,
        "done": info.done,
        "heldBy": info.holder_name,
        "heldAt": None if holder is None else holder.at // 1000,  # ms, as the original
        "known": info.known or (history is not None and history.story.published),
        # ours
        "dead": info.dead,
        "heldByWorker": None if holder is None else holder.worker,
        "heldByLabel": None if holder is None else worker_label(holder.worker),
        "leaseExpired": None if holder is None else holder.expiry <= now,
        "claim": None if holder is None else holder.claim,
        "expiresAt": None if holder is None else holder.expiry // 1000,
        "attempts": info.attempts,
        "lastError": info.last_error,
        "function": None,  # a task by name's (from its history: the TASK record)
    }
    if history is not None:
        body.update(history.to_json())
    return body


# -- the server ------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    source: StatsSource  # set on the subclass made per server
    logs: str | None  # where task histories are read (None: the snapshot's location)
    web: WebRoutes  # the browser's paths: the dashboard, its frames, the timeline, control

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        answer = self.web.get(path)
        if answer is not None:
            self._send(*answer)
        elif path == "/events":
            self._stream()
        elif path == "/health":
            trouble = health_problems(self.source.snapshot())
            if trouble:  # a log failing under a worker (a full disk): not healthy
                self._send(503, "text/plain; charset=utf-8", "".join(f"{t}\n" for t in trouble))
            else:
                self._send(200, "text/plain; charset=utf-8", "ok\n")
        elif path == "/stats":
            self._json(200, stats_json(self.source.snapshot()))
        elif path == "/metrics":
            self._send(200, PROMETHEUS_CONTENT_TYPE, metrics_text(self.source.snapshot()))
        elif path.startswith("/task/"):
            self._task(path.removeprefix("/task/"))
        else:
            self._json(
                404, {"error": f"no such path {path}; try / /health /stats /task/ID /metrics"}
            )

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        length = self.headers.get("Content-Length", "0")
        if not length.isdigit() or int(length) > MAX_POST_BODY:
            self._json(413, {"error": f"a control request's body is at most {MAX_POST_BODY} bytes"})
            return
        body = self.rfile.read(int(length))
        status, answer = self.web.post(path, self.headers.get(TOKEN_HEADER), body)
        self._json(status, answer)

    def _stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.web.stream(self.wfile.write, self.wfile.flush)

    def _task(self, text: str) -> None:
        partitioned = getattr(self.source, "partition_task", None)
        if partitioned is not None:  # a partitioned queue (supervisor.partitioned.view)
            self._partition_task(partitioned, text)
            return
        task = parse_task_id(text)
        if task is None:
            shown = text if len(text) <= 40 else text[:39] + "…"
            self._json(
                400,
                {
                    "error": f"task id {shown!r} is not a task id; expected /task/ID, "
                    f"ID from 0 to {MAX_TASK_ID}"
                },
            )
            return
        info = self.source.task_info(task)
        if info is None:
            self._json(503, {"error": "the supervisor has not started"})
            return
        try:
            history = read_task_history(self.logs or self.source.snapshot().location, task)
        except LogError as e:
            self._json(500, {"error": str(e)})
            return
        if not history.exists:
            self._json(404, {"error": f"no task {task}: no TASK record and no claim names it"})
            return
        self._json(200, task_json(info, history))

    def _partition_task(
        self, find: Callable[[str], tuple[Any, TaskInfo | None, str]], text: str
    ) -> None:
        """/task/K:ID: task ID of partition K, from that partition's fold and logs."""
        head, sep, tail = text.partition(":")
        if not sep or not head.isascii() or not head.isdigit() or parse_task_id(tail) is None:
            shown = text if len(text) <= 40 else text[:39] + "…"
            self._json(
                400,
                {
                    "error": f"{shown!r} is not a task of a partitioned queue; expected "
                    "/task/K:ID, like /task/0:17"
                },
            )
            return
        try:
            ref, info, where = find(text)
        except ValueError as e:  # a partition the queue does not have
            self._json(404, {"error": str(e)})
            return
        if info is None:
            self._json(503, {"error": "the supervisor has not started"})
            return
        try:
            history = read_task_history(where, ref.task)
        except LogError as e:
            self._json(500, {"error": str(e)})
            return
        if not history.exists:
            self._json(404, {"error": f"no task {ref}: no TASK record and no claim names it"})
            return
        self._json(200, {**task_json(info, history), "task": str(ref), "partition": ref.partition})

    def _json(self, status: int, body: object) -> None:
        self._send(status, "application/json", json.dumps(body) + "\n")

    def _send(
        self, status: int, content_type: str, body: str, headers: dict[str, str] | None = None
    ) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the dashboard owns the terminal: no access log on stderr


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (closed or reset its connection, mid-request or before
        reading the answer) is not an error worth a traceback on the dashboard's terminal;
        anything else still gets one."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _IPv6Server(_Server):
    address_family = socket.AF_INET6


class StatsServer:
    """The endpoint on (host, port); `start()` serves from a daemon thread. `logs` is where
    /task/ID and /timeline read the logs (the location with its password, if any); by
    default the location the snapshot shows. `control`: --http-control's kill and pause
    (None: those paths do not exist)."""

    def __init__(
        self,
        source: StatsSource,
        host: str,
        port: int,
        *,
        logs: str | None = None,
        control: ControlDesk | None = None,
    ) -> None:
        self._web = WebRoutes(source, logs, control)
        members = {"source": source, "logs": logs, "web": self._web}
        handler = type("StatsHandler", (_Handler,), members)
        server_class = _IPv6Server if ":" in host else _Server
        # Binds now, so that a busy port is an error before any worker starts.
        self._server = server_class((host, port), handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="qw-http", daemon=True
        )

    @property
    def address(self) -> str:
        address = self._server.server_address
        host, port = str(address[0]), int(address[1])
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._web.stopping.set()  # the browsers' streams end
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()
