"""/metrics of `qw up --http`: the snapshot in the Prometheus text exposition format
(version 0.0.4), one family per figure; a worker's samples are labelled with its name
(and its partition, on a partitioned queue)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from queue_worker.worker.snapshot import WorkerSnapshot
from supervisor.run.model import SupervisorSnapshot, WorkerView

__all__ = ["PROMETHEUS_CONTENT_TYPE", "metrics_text"]

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


Sample = tuple[str, dict[str, str], float]  # (name suffix, labels, value)


def _family(name: str, kind: str, help_text: str, samples: Iterable[Sample]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    for suffix, labels, value in samples:
        text = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        lines.append(f"{name}{suffix}{{{text}}} {value}" if text else f"{name}{suffix} {value}")
    return lines


#: per-worker counters: (metric name, the count, help)
_WORKER_COUNTERS: tuple[tuple[str, Callable[[WorkerSnapshot], int], str], ...] = (
    ("qw_worker_attempts_total", lambda s: s.attempts, "CLAIM records appended."),
    ("qw_worker_won_total", lambda s: s.won, "Claims won (takeovers included)."),
    (
        "qw_worker_lost_total",
        lambda s: s.lost_total,
        "Claims lost to another holder, done or backoff.",
    ),
    ("qw_worker_finished_total", lambda s: s.finished, "DONE records accepted."),
    ("qw_worker_takeovers_total", lambda s: s.takeovers, "Wins over an expired holder."),
    (
        "qw_worker_stale_total",
        lambda s: s.stale,
        "DONE records refused: the lease had been lost.",
    ),
    ("qw_worker_failed_total", lambda s: s.failed, "FAIL records accepted."),
    ("qw_worker_timeouts_total", lambda s: s.timeouts, "Leases that lapsed under this worker."),
    ("qw_worker_renewals_total", lambda s: s.renewals, "Leases renewed."),
)


_STATES = ("published", "pending", "held", "done", "failed", "dead")


def _who(w: WorkerView, **more: str) -> dict[str, str]:
    """A worker's labels: its name, and its partition on a partitioned queue."""
    labels = {"worker": w.name}
    if w.partition is not None:
        labels["partition"] = str(w.partition)
    return {**labels, **more}


def metrics_text(snap: SupervisorSnapshot) -> str:
    q = snap.queue
    lines = _family(
        "qw_tasks",
        "gauge",
        "Tasks by state, from the supervisor's fold of the claims log.",
        [("", {"state": state}, getattr(q, state)) for state in _STATES],
    )
    if snap.partitions:
        lines += _family(
            "qw_partition_tasks",
            "gauge",
            "Tasks by state in each partition of a partitioned queue.",
            [
                ("", {"partition": str(k), "state": state}, getattr(p, state))
                for k, p in enumerate(snap.partitions)
                for state in _STATES
            ],
        )
        lines += _family(
            "qw_orphans",
            "gauge",
            "Tasks whose holder died, waiting for their lease to lapse, per partition.",
            [
                (
                    "",
                    {"partition": str(k)},
                    sum(1 for o in snap.orphans if o.partition == k and o.heir is None),
                )
                for k in range(len(snap.partitions))
            ],
        )
    lines += _family(
        "qw_throughput_tasks_per_second",
        "gauge",
        "Tasks done per second.",
        [("", {}, q.throughput_now)],
    )
    lines += _family("qw_log_bytes", "gauge", "Bytes in both log files.", [("", {}, q.log_bytes)])
    read = "Records read from both logs (after the fold checkpoint the monitor began from)."
    lines += _family("qw_log_records", "gauge", read, [("", {}, q.record_count)])
    workers = snap.workers
    alive = [("", _who(w), 0 if w.ended else 1) for w in workers]
    lines += _family("qw_worker_up", "gauge", "1 while the worker process runs.", alive)
    for name, count, help_text in _WORKER_COUNTERS:
        samples = [("", _who(w), count(w.stats)) for w in workers]
        lines += _family(name, "counter", help_text, samples)
    lines += _family(
        "qw_worker_restarts_total",
        "counter",
        "Times the slot's worker was restarted.",
        [("", _who(w), w.restarts) for w in workers],
    )
    lines += _family(
        "qw_worker_cpu_percent",
        "gauge",
        "CPU use of the worker process (100 = one core).",
        [("", _who(w), w.cpu_percent) for w in workers],
    )
    lines += _family(
        "qw_worker_rss_bytes",
        "gauge",
        "Resident memory of the worker process.",
        [("", _who(w), w.rss_bytes) for w in workers],
    )
    latency: list[Sample] = []
    for w in workers:
        lat = w.stats.claim_latency_micros
        for quantile, value in (("0.5", lat.p50), ("0.9", lat.p90), ("0.99", lat.p99)):
            latency.append(("", _who(w, quantile=quantile), value))
        latency.append(("_count", _who(w), lat.samples))
    lines += _family(
        "qw_claim_latency_microseconds",
        "summary",
        "Claim round trip (append start to settled verdict) over the recent window.",
        latency,
    )
    return "\n".join(lines) + "\n"
