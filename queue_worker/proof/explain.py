"""`qw why TASK`: every record about one task, in log order, with the rule that decided it.

`explain_task` is pure: it folds the whole claims log through `ClaimState` (the verdicts are
the fold's, never re-derived here) and, for the records about one task, words the outcome
with the facts a reader needs: whose lease a claim ran into and until when, whose expired
lease a takeover replaced, which claim held the task when a completion was refused.

The fold keeps each task apart: no rule reads another task's records (queue_worker.protocol.state),
so a `ClaimState` given only one task's records reaches the verdicts on them that the whole
log's fold reaches. `explain_batches(..., fold_others=False)` tells the story that way (what
`qw why` and `qw task` do, from a read that need not decode the other records at all:
`log_reading.read_claims_batches(location, task)`).
"""

import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from queue_worker.names import function_label, printable, worker_label
from queue_worker.ops import DEATH, OpRecord, held_by
from queue_worker.protocol.clock_jumps import ClockWatch
from queue_worker.protocol.records import (
    Cancel,
    Claim,
    ClaimsRecord,
    Done,
    Fail,
    Renew,
    TaskRecord,
    Unknown,
)
from queue_worker.protocol.state import ClaimSnapshot, ClaimState, Lease, Outcome, Verdict
from queue_worker.times import ago_text, clock_text, duration_text
from queue_worker.values import value_text

#: how the dead FAIL of a task whose dependency died begins (queue_worker.worker.dependencies)
DEPENDENCY_DEAD = "dependency "

# NamedTuples and a plain class, not dataclasses: `dataclasses` (it imports inspect) and
# building each class are ~15 ms of `qw task` and `qw why`, which are little else.


class Step(NamedTuple):
    """One record about the task, and why the fold decided what it did."""

    position: int  # in the claims log; for the TASK step, its index in the tasks log (its id)
    kind: str  # TASK, CLAIM, RENEW, DONE, FAIL; OP (an ops record), CLOCK (a clock jump)
    worker: str | None
    at: int  # 0 when unknown (an unreadable TASK record)
    verdict: str  # the Verdict's word ("won", "lost: held", …); "published" for TASK
    why: str
    claim: int | None = None  # the claim a RENEW/DONE/FAIL acted under
    traceback: str | None = None  # a FAIL's: the handler's traceback, when it raised


class TaskStory(NamedTuple):
    task: int
    published: bool
    steps: tuple[Step, ...]
    state: str  # done | dead | held by … | waiting | never claimed | unpublished
    function: str | None = None  # a task by name's function (its TASK record's)
    after: tuple[int, ...] = ()  # the tasks it waits for (`enqueue(after=…)`)

    def named(self, label: str | None = None) -> str:
        """The task's id (or `label`: ``2:17`` on a partitioned queue) with its function
        after it, as screens show it: ``17 resize``."""
        shown = str(self.task) if label is None else label
        return shown if self.function is None else f"{shown} {function_label(self.function)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "function": self.function,
            "after": list(self.after),
            "published": self.published,
            "state": self.state,
            "records": [
                {
                    "position": s.position,
                    "kind": s.kind,
                    "worker": s.worker,
                    "label": None if s.worker is None else worker_label(s.worker),
                    "at": s.at,
                    "verdict": s.verdict,
                    "why": s.why,
                    "claim": s.claim,
                    "traceback": s.traceback,
                }
                for s in self.steps
            ],
        }


_FIRST = operator.itemgetter(0)
_ENDS = (Verdict.DONE, Verdict.RELEASED, Verdict.DEAD)
_VERBS = {"kill": "killed", "pause": "paused", "resume": "resumed", "restart": "restarted"}


def op_text(op: OpRecord, worker: str, holding: str) -> str:
    """ "w6·6975 killed by the operator at 03:31:52.103, holding this task" """
    who = worker_label(worker)
    when = clock_text(op.at)
    if op.kind == DEATH:
        return f"{who} died ({op.detail}), seen by the {op.by} at {when}, {holding}"
    verb = _VERBS.get(op.kind, op.kind)
    detail = f" ({op.detail})" if op.detail and op.kind not in _VERBS else ""
    return f"{who} {verb}{detail} by the {op.by} at {when}, {holding}"


def _lease_text(lease: Lease) -> str:
    return f"{worker_label(lease.worker)} (claim @{lease.claim})"


class _Teller:
    """The fold plus the few facts about one task that the words need."""

    def __init__(
        self,
        task: int,
        state: ClaimState | None = None,
        seen: Callable[[int, ClaimsRecord], None] | None = None,
    ) -> None:
        self.task = task
        self.seen = seen  # called with each record about the task (apply_batch)
        self.state = state if state is not None else ClaimState()
        self.wins: list[int] = []  # winning claims of the task
        self.last_at: dict[int, int] = {}  # claim -> its last accepted at
        self.closed_at: int | None = None  # the position of the DONE or dead FAIL
        self.released = False
        self.steps: list[Step] = []
        # clock jumps shown by the task's own records (queue_worker.protocol.clock_jumps; the report
        # judges each record against the whole log)
        self.clock = ClockWatch()
        # winning claim -> [worker, won at, ended at (None: still held), its holder's last
        # record under it, refused or not]: who held the task when, and who worked on past
        # losing it
        self.spans: dict[int, list[Any]] = {}

    def apply(self, record: ClaimsRecord, position: int) -> None:
        if isinstance(record, Unknown) or record.task != self.task:
            self.state.apply(record, position)
            return
        before = self.state.holder(self.task)
        outcome = self.state.apply(record, position)
        if isinstance(record, Claim):
            step = self._claim(record, outcome)
        elif isinstance(record, Renew):
            step = self._renew(record, outcome, before)
        elif isinstance(record, Done):
            step = self._done(record, outcome)
        else:
            step = self._fail(record, outcome)
        self._span(record, outcome)
        self.steps.append(step)
        jump = self.clock.see(position, record)
        if jump is not None:
            claim = None if isinstance(record, Claim) else record.claim
            self.steps.append(
                Step(position, "CLOCK", record.worker, record.at, "observed", jump.text, claim)
            )

    def apply_batch(
        self, records: Sequence[ClaimsRecord], positions: Sequence[int], fold_others: bool = True
    ) -> None:
        """`apply` each record in turn: the runs of other tasks' records, which are only
        folded, in one `ClaimState.apply_all` each (its exact effect, without building
        verdicts nobody reads), found by the task id every known record has first.
        `fold_others=False`: only the task's own records are applied (module docstring)."""
        task = self.task
        firsts = list(map(_FIRST, records))  # (an Unknown's first field is its code)
        begin = 0
        while True:
            try:
                i = firsts.index(task, begin)
            except ValueError:
                break
            record = records[i]
            if isinstance(record, Unknown):  # a code equal to the task id: only folded
                firsts[i] = None
                continue
            if begin < i and fold_others:
                self.state.apply_all(records[begin:i], positions[begin:i])
            self.apply(record, positions[i])
            if self.seen is not None:
                self.seen(positions[i], record)
            begin = i + 1
        if begin < len(records) and fold_others:
            self.state.apply_all(records[begin:], positions[begin:])

    def _span(self, r: Claim | Renew | Done | Fail, o: Outcome) -> None:
        if isinstance(r, Claim) and o.verdict.won:
            if o.previous is not None and o.previous.claim in self.spans:
                self.spans[o.previous.claim][2] = r.at
            self.spans[o.position] = [r.worker, r.at, None, r.at]
        elif not isinstance(r, Claim) and r.claim in self.spans:
            span = self.spans[r.claim]
            if o.verdict in _ENDS:
                span[2] = r.at
            if span[0] == r.worker:
                span[3] = max(span[3], r.at)

    def cite(self, op: OpRecord) -> Step | None:
        """The op as a step of this task's story, when its process held the task then."""
        for claim, (worker, start, end, last) in self.spans.items():
            if not held_by(op, worker) or op.at < start:
                continue
            if end is None or op.at <= end:
                text = op_text(op, worker, "holding this task")
            elif op.at <= last:  # it wrote again under this claim later: worth telling
                text = op_text(op, worker, f"after losing this task (claim @{claim})")
            else:
                continue
            return Step(claim, "OP", worker, op.at, op.kind, text, claim)
        return None

    def _step(self, kind: str, r: Claim | Renew | Done | Fail, o: Outcome, why: str) -> Step:
        claim = None if isinstance(r, Claim) else r.claim
        return Step(o.position, kind, r.worker, r.at, o.verdict.value, why, claim)

    def _claim(self, r: Claim, o: Outcome) -> Step:
        v = o.verdict
        if v is Verdict.WON:
            self.wins.append(o.position)
            self.last_at[o.position] = r.at
            why = "won: nobody held it"
            if self.released:
                why = "won: nobody held it and its retry time had come"
            why += f"; lease until {clock_text(r.at + r.lease)}"
        elif v is Verdict.TAKEOVER:
            assert o.previous is not None
            prev = o.previous
            self.wins.append(o.position)
            self.last_at[o.position] = r.at
            last = self.last_at.pop(prev.claim, prev.at)
            why = (
                f"won, a takeover of {_lease_text(prev)}: that lease expired at "
                f"{clock_text(prev.expiry)}, {duration_text(r.at - prev.expiry)} before this "
                f"claim; its holder's last record was {duration_text(r.at - last)} earlier"
            )
        elif v is Verdict.LOST_HELD:
            assert o.holder is not None
            why = (
                f"lost because held by {_lease_text(o.holder)} until "
                f"{clock_text(o.holder.expiry)} ({duration_text(o.holder.expiry - r.at)} "
                "after this claim)"
            )
        elif v is Verdict.LOST_DONE:
            why = f"lost: the task was already done (@{self.closed_at})"
        elif v is Verdict.LOST_DEAD:
            why = f"lost: the task is dead (@{self.closed_at})"
        else:
            assert o.retry_at is not None
            why = f"lost: the task may not be retried before {clock_text(o.retry_at)}"
        return self._step("CLAIM", r, o, why)

    def _refused(self, o: Outcome) -> str:
        if o.holder is not None:
            return f"the holder is {_lease_text(o.holder)}"
        if self.state.is_done(self.task):
            return f"the task was already done (@{self.closed_at})"
        if self.state.is_dead(self.task):
            return f"the task is dead (@{self.closed_at})"
        return "nobody holds the task"

    def _renew(self, r: Renew, o: Outcome, before: Lease | None) -> Step:
        if o.verdict is Verdict.RENEWED:
            self.last_at[r.claim] = r.at
            left = "" if before is None else f" ({duration_text(before.expiry - r.at)} were left)"
            why = f"renewed: lease until {clock_text(r.at + r.lease)}{left}"
        else:
            why = f"lease lost: claim @{r.claim} no longer holds the task; {self._refused(o)}"
        return self._step("RENEW", r, o, why)

    def _done(self, r: Done, o: Outcome) -> Step:
        if o.verdict is Verdict.DONE:
            assert o.holder is not None
            self.closed_at = o.position
            margin = o.holder.expiry - r.at
            when = "before" if margin >= 0 else "after"
            why = (
                f"done: accepted from the holder, claim @{r.claim}, "
                f"{duration_text(abs(margin))} {when} its lease expired"
            )
        else:
            why = f"stale: claim @{r.claim} is not the holder; {self._refused(o)}"
            ran = r.claim in self.wins
            others = [w for w in self.wins if w != r.claim]
            if ran and others:
                why += (
                    f". Claim @{r.claim} had won, so its handler ran to completion while "
                    f"claim @{others[-1]} also ran it: the task was worked twice (the result "
                    "is discarded)"
                )
            else:
                why += "; the result is discarded"
        return self._step("DONE", r, o, why)

    def _fail(self, r: Fail, o: Outcome) -> Step:
        v = o.verdict
        if v is Verdict.DEAD and type(r) is Cancel:
            self.closed_at = o.position
            why = f"cancelled: {printable(r.message)}"
        elif v is Verdict.DEAD and r.message.startswith(DEPENDENCY_DEAD):
            self.closed_at = o.position  # (written without running it: dependencies)
            why = f"dead: {printable(r.message)}"
        elif v is Verdict.DEAD:
            self.closed_at = o.position
            why = f"dead: attempts used up; last error: {printable(r.message)}"
        elif v is Verdict.RELEASED:
            assert r.retry_at is not None
            self.released = True
            when = clock_text(r.retry_at)
            why = f"released after error: {printable(r.message)}; retry at {when}"
        else:
            why = f"stale fail: claim @{r.claim} is not the holder; {self._refused(o)}"
        step = self._step("FAIL", r, o, why)
        return step if r.traceback is None else step._replace(traceback=r.traceback)

    def final_state(self, published: bool, now_us: int | None) -> str:
        if self.state.is_done(self.task):
            if self.closed_at is None:  # its records were compacted away
                return "done (its records were removed by compaction: settled history)"
            return f"done (@{self.closed_at})"
        if self.state.is_dead(self.task):
            return f"dead: {printable(self.state.dead_error(self.task) or '')}"
        holder = self.state.holder(self.task)
        if holder is not None and now_us is not None and holder.expiry <= now_us:
            # The fold still names this claim the holder (no record has replaced it); that
            # the lease has run out is this machine's clock speaking, for the reader.
            return (
                f"held by {_lease_text(holder)}, but its lease expired at "
                f"{clock_text(holder.expiry)}, {ago_text(holder.expiry, now_us)} by this "
                "machine's clock: a live worker may take it over"
            )
        if holder is not None:
            return f"held by {_lease_text(holder)} until {clock_text(holder.expiry)}"
        if self.released:
            return "waiting for its retry time"
        return "never claimed" if published else "not published"


def call_text(record: TaskRecord) -> str:
    """What a TASK asks for: "payload {…}" (JSON, as everywhere else), or "call add(1, 2)"
    for a task by name."""
    if record.function is None:
        return f"payload {value_text(record.payload, 60)}"
    args = [value_text(a, 30) for a in record.args]
    args += [f"{printable(k)}={value_text(v, 30)}" for k, v in record.kwargs.items()]
    text = f"call {printable(record.function)}({', '.join(args)})"
    if record.after:
        tasks = "task" if len(record.after) == 1 else "tasks"
        text += f", after {tasks} {', '.join(map(str, record.after))}"
    return text if record.retry_of is None else f"{text}, a retry of task {record.retry_of}"


def explain_task(
    task: int,
    task_record: TaskRecord | str | None,
    claims: Iterable[tuple[int, ClaimsRecord]],
    ops: Iterable[OpRecord] = (),
    now_us: int | None = None,
    start: ClaimSnapshot | None = None,
) -> TaskStory:
    """The story of `task`: its TASK record (a string when it cannot be read, None when the
    tasks topic lacks it) and every claims record about it, each with why the fold decided
    what it did; and the ops records (kills, pauses, deaths) of a process while it held the
    task, placed by time among the others (kind "OP"). With `now_us` (the reader's clock),
    a held task whose lease has run out by then is said to be expired. `start`: the fold
    before the first of `claims`, for logs whose earlier records were compacted away
    (`queue_worker.proof.report.prefix_state`)."""
    teller = _Teller(task) if start is None else _Teller(task, ClaimState.restore(start))
    for position, record in claims:
        teller.apply(record, position)
    return _story(teller, task_record, ops, now_us)


def explain_batches(
    task: int,
    task_record: TaskRecord | str | None,
    batches: Iterable[tuple[Sequence[ClaimsRecord], Sequence[int]]],
    ops: Iterable[OpRecord] = (),
    now_us: int | None = None,
    start: ClaimSnapshot | None = None,
    seen: Callable[[int, ClaimsRecord], None] | None = None,
    fold_others: bool = True,
) -> TaskStory:
    """`explain_task` of the claims given as batches of records and their positions
    (`queue_worker.proof.log_reading.read_claims_batches`): the same story, the other tasks'
    records folded a run at a time, or (`fold_others=False`) not at all: the story is the
    same (module docstring). `seen` is called with each record about the task."""
    state = None if start is None else ClaimState.restore(start)
    teller = _Teller(task, state, seen)
    for records, positions in batches:
        teller.apply_batch(records, positions, fold_others)
    return _story(teller, task_record, ops, now_us)


def _story(
    teller: _Teller,
    task_record: TaskRecord | str | None,
    ops: Iterable[OpRecord],
    now_us: int | None,
) -> TaskStory:
    task = teller.task
    steps = list(teller.steps)
    for op in ops:
        cited = teller.cite(op)
        if cited is not None:
            # after the records written before it (the log's order is close to time order)
            where = next((i for i, s in enumerate(steps) if s.at > op.at), len(steps))
            steps.insert(where, cited)
    if isinstance(task_record, TaskRecord):
        what = call_text(task_record)
        first = Step(task, "TASK", None, task_record.enqueued_at, "published", what)
        steps.insert(0, first)
    elif task_record is not None:
        why = f"unreadable: {printable(task_record)}"
        steps.insert(0, Step(task, "TASK", None, 0, "published", why))
    published = task_record is not None
    state = teller.final_state(published, now_us)
    if not isinstance(task_record, TaskRecord):
        return TaskStory(task, published, tuple(steps), state)
    function, after = task_record.function, task_record.after
    if after and state == "never claimed":  # (the rule: queue_worker.worker.dependencies)
        tasks = "task" if len(after) == 1 else "tasks"
        state += (
            f": it waits for {tasks} {', '.join(map(str, after))} (no worker tries it before "
            "they are all done, or one is dead)"
        )
    return TaskStory(task, published, tuple(steps), state, function, after)
