"""A member of a partitioned queue: one worker process whose partitions follow membership.

``python -m queue_worker.partitions.member '<worker config JSON>'`` (the config's location is the
partitioned queue's own, not a partition's). The process:

1. joins: a heartbeat thread appends a HEARTBEAT to the members topic every lease/3, on a
   log handle of its own (`queue_worker.partitions.membership`), so a long task never makes the
   member look dead; every TRIM_EVERY beats it removes what of the topic no longer counts
   (`queue_worker.partitions.members_trim`);
2. loops: reads the members topic, computes the assignment (`MemberView.assignment`), and
   keeps one `Worker` per partition it is assigned — an ordinary worker on that
   partition's location, with its own worker id — stepping each in turn; when all are idle
   it waits `idle_poll_s`;
3. a partition taken away is *released*: its worker is drained (a claim it made ahead is
   still settled and worked: it holds that task under the fold) and closed. Nothing is
   handed over: the partition's new member claims what is free, and what the old one held
   when it died is taken over by lease expiry only (Rule 1);
4. on SIGTERM (or `stop`): drains every worker, appends LEAVE, and exits 0.

A member killed with -9 writes no LEAVE: its heartbeats stop, the others see it gone
once its last heartbeat's lease has passed by the log's clock, and they reassign its
partitions among themselves.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import sys
import threading
from pathlib import Path
from typing import Final

from logstore import LogError
from queue_worker.opening import open_worker
from queue_worker.partition_layout import Manifest, partition_location, read_manifest
from queue_worker.partitions.members_trim import TRIM_EVERY, trim_members_at
from queue_worker.partitions.membership import (
    MemberView,
    encode_heartbeat,
    encode_leave,
    open_members,
)
from queue_worker.protocol.clock import Clock, now_us
from queue_worker.worker.attempt import StepKind
from queue_worker.worker.base import WorkerBase
from queue_worker.worker.config import WorkerConfig, default_host
from queue_worker.worker.lease import FATAL_LOG_ERRORS

#: heartbeats per lease
HEARTBEATS_PER_LEASE: Final = 3


def new_member_id(name: str, host: str | None) -> str:
    return f"{name}@{host or default_host()}-{os.getpid()}-{secrets.token_hex(2)}"


class Member:
    """A member process's loop (see the module docstring). Drive it with `run(stop)`."""

    def __init__(
        self, config: WorkerConfig, manifest: Manifest | None = None, *, clock: Clock = now_us
    ) -> None:
        config.validate()
        found = manifest if manifest is not None else read_manifest(config.location)
        if found is None:
            raise LogError(f"{config.location}: not a partitioned queue (no manifest)")
        self.manifest = found
        self.config = config
        self.member_id = new_member_id(config.name, config.host)
        self._clock = clock
        self.view = MemberView()
        self.workers: dict[int, WorkerBase] = {}
        self.assigned: list[int] = []
        self._members = open_members(config.location)
        self._beating = threading.Event()
        self._beat_error: str | None = None
        self._heart = threading.Thread(target=self._heartbeats, name="qw-heartbeat", daemon=True)

    # -- membership ----------------------------------------------------------------------------

    @property
    def lease_us(self) -> int:
        return self.config.lease_us

    def _heartbeats(self) -> None:
        """Append a HEARTBEAT every lease/HEARTBEATS_PER_LEASE until stopped (its own log
        handle: a handle is for one thread)."""
        period = self.config.lease_s / HEARTBEATS_PER_LEASE
        log = open_members(self.config.location)
        beats = 0
        try:
            while not self._beating.is_set():
                try:
                    log.append(encode_heartbeat(self.member_id, self._clock(), self.lease_us))
                    beats += 1
                    if beats % TRIM_EVERY == 0:  # the topic stays small (members_trim)
                        trim_members_at(self.config.location)
                except LogError as e:  # out of reach for a moment: the next beat retries
                    self._beat_error = str(e)
                self._beating.wait(period)
        finally:
            log.close()

    def rebalance(self) -> None:
        """Read the members topic, and take or release partitions to match the assignment."""
        try:
            self.view.catch_up(self._members)
        except LogError:
            # trimmed ahead of this handle (members_trim), or out of reach: read the topic
            # again from its start on a new handle (a second failure is the log's)
            self._members.close()
            self._members = open_members(self.config.location)
            self.view = MemberView()
            self.view.catch_up(self._members)
        mine = self.view.assignment(self.manifest.count).get(self.member_id, [])
        self.assigned = mine
        for k in [k for k in self.workers if k not in mine]:
            self.release(k)
        for k in mine:
            if k not in self.workers:
                self.workers[k] = self._worker(k)

    def _worker(self, partition: int) -> WorkerBase:
        config = dataclasses.replace(
            self.config,
            location=partition_location(self.config.location, partition, self.manifest.count),
            name=f"{self.config.name}.p{partition}",
            slot=0,
            slots=1,
            exit_when_drained=False,
        )
        # No claim ahead: the member steps its workers in turn, so a CLAIM appended with a
        # DONE would wait out the other partitions' tasks with no lease keeper, lapse, and
        # the member would take its own task over.
        return open_worker(config, claim_ahead=False)

    def release(self, partition: int) -> None:
        """Stop working `partition`: finish what is in hand (a claim made ahead holds its
        task under the fold), make no new claim, close its logs."""
        worker = self.workers.pop(partition)
        worker.drain()
        with worker:
            worker.run(threading.Event())  # returns once nothing is in hand

    # -- the loop ------------------------------------------------------------------------------

    def _step(self, worker: WorkerBase) -> bool:
        """One step of one partition's worker, as `WorkerBase.run` takes it; whether it did
        anything. A log out of reach only skips the step (the worker resumes later)."""
        try:
            result = worker.step()
        except FATAL_LOG_ERRORS:
            raise
        except LogError as e:
            worker.record.log_error(e)
            return False
        worker.record.publish()
        return result.kind is not StepKind.IDLE

    def run(self, stop: threading.Event) -> None:
        self._heart.start()
        try:
            while not stop.is_set():
                self.rebalance()
                busy = False
                for partition in list(self.workers):
                    if stop.is_set():
                        break
                    busy = self._step(self.workers[partition]) or busy
                if not busy:
                    stop.wait(self.config.idle_poll_s)
        finally:
            for partition in list(self.workers):
                self.release(partition)
            self._beating.set()
            self._heart.join(10)
            try:
                self._members.append(encode_leave(self.member_id, self._clock()))
            finally:
                self._members.close()


def run_member_process(config_json: str) -> None:
    """The member process: dies with its parent, drains on SIGTERM, exits 1 on a log it
    cannot use (the reason on stderr in one line)."""
    from queue_worker.process import EXIT_CONFIG, EXIT_ERROR, _die_with_parent, _parent_pid

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        config = WorkerConfig.from_json(config_json)
        config.validate()
    except ValueError as e:
        print(f"qw member: invalid config: {e}", file=sys.stderr)
        raise SystemExit(EXIT_CONFIG) from None
    _die_with_parent(_parent_pid(config))
    try:
        Member(config).run(stop)
    except LogError as e:
        print(f"qw member {config.name}: {e}", file=sys.stderr)
        raise SystemExit(EXIT_ERROR) from None


def member_command(config: WorkerConfig) -> list[str]:
    """The command line that starts a member process for `config`."""
    return [sys.executable, "-m", "queue_worker.partitions.member", config.to_json()]


def read_assignment(location: str | Path, manifest: Manifest) -> dict[str, list[int]]:
    """The assignment the members topic gives now (for `qw report`, tests and people)."""
    view = MemberView()
    log = open_members(location)
    try:
        view.catch_up(log)
    finally:
        log.close()
    return view.assignment(manifest.count)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(
            "usage: python -m queue_worker.partitions.member '<worker config JSON>'",
            file=sys.stderr,
        )
        sys.exit(2)
    run_member_process(sys.argv[1])
