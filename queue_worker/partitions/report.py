"""The report of a partitioned queue: each partition's proof, and the whole queue's.

Each partition is replayed by `load_report` exactly as a queue is (its own fold over its
own claims topic). The whole queue is proven exactly once when every partition is: a task
is named by its partition and its id there (``k:id``), so two partitions never share a
task, and the sums below are identities a bug would break:

- completions accepted = tasks done, summed over the partitions;
- every partition's tasks are its own: a worker's records never name a task of another
  partition (the report checks each partition against its own tasks topic, and a claim of
  an id that topic lacks is listed as unpublished).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from logstore import LogError
from queue_worker.partition_layout import Manifest, TaskRef
from queue_worker.partitions.queue import open_partition_topic
from queue_worker.proof.report import (
    EXIT_OK,
    EXIT_WORKED_TWICE,
    Report,
    ReportInputError,
    build_report,
    has_logs,
    load_report,
)


@dataclass(frozen=True)
class PartitionedReport:
    manifest: Manifest
    partitions: tuple[Report, ...]

    @property
    def tasks_published(self) -> int:
        return sum(r.tasks_published for r in self.partitions)

    @property
    def tasks_done(self) -> int:
        return sum(r.tasks_done for r in self.partitions)

    @property
    def completions_accepted(self) -> int:
        return sum(r.completions_accepted for r in self.partitions)

    @property
    def worked_twice(self) -> list[TaskRef]:
        return [TaskRef(k, w.task) for k, r in enumerate(self.partitions) for w in r.worked_twice]

    def accounting_errors(self) -> list[str]:
        errors = [
            f"partition {k}: {e}"
            for k, r in enumerate(self.partitions)
            for e in r.accounting_errors()
        ]
        if self.completions_accepted != self.tasks_done:
            errors.append(
                f"{self.completions_accepted} completions accepted but {self.tasks_done} "
                "distinct tasks done over the partitions"
            )
        return errors

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.partitions) and not self.accounting_errors()

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.ok else EXIT_WORKED_TWICE

    @property
    def verdict(self) -> str:
        twice = self.worked_twice
        if twice:
            noun = "a task was" if len(twice) == 1 else "tasks were"
            return f"FAIL: {noun} worked twice: {', '.join(map(str, twice))}"
        errors = self.accounting_errors()
        if errors:
            return f"FAIL: {errors[0]}"
        return (
            f"OK: every finished task was completed exactly once ({self.tasks_done} done in "
            f"{self.manifest.count} partitions), none was worked twice"
        )

    def partition_line(self, k: int) -> str:
        r = self.partitions[k]
        state = "OK" if r.ok else "FAIL"
        return (
            f"partition {k}: {state} · published {r.tasks_published} · done {r.tasks_done} · "
            f"completions {r.completions_accepted} · held {r.tasks_held} · dead {r.tasks_dead} · "
            f"takeovers {len(r.takeovers)} · claims records {r.claims_records}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "partitioned": True,
            "queue": self.manifest.queue.hex(),
            "partitions": self.manifest.count,
            "verdict": self.verdict,
            "ok": self.ok,
            "tasks_published": self.tasks_published,
            "tasks_done": self.tasks_done,
            "completions_accepted": self.completions_accepted,
            "worked_twice": [str(t) for t in self.worked_twice],
            "accounting_errors": self.accounting_errors(),
            "per_partition": [
                {"partition": k, **r.to_json()} for k, r in enumerate(self.partitions)
            ],
        }


def load_partitioned_report(location: str | Path, manifest: Manifest) -> PartitionedReport:
    """Replay every partition of the queue at `location`. ReportInputError (naming the
    partition) for a partition whose logs are missing, damaged or not this queue's."""
    reports = []
    for k in range(manifest.count):
        try:
            where = open_partition_topic(location, manifest, k)
        except LogError as e:
            raise ReportInputError(str(e)) from e
        try:
            # A partition no task went to yet has no records (on Redis: no streams at all)
            reports.append(load_report(where) if has_logs(where) else build_report(0, []))
        except ReportInputError as e:
            raise ReportInputError(f"partition {k}: {e}") from e
    return PartitionedReport(manifest, tuple(reports))


__all__ = ["PartitionedReport", "load_partitioned_report"]
