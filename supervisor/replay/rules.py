"""The rules a replay folds the claims log by, behind one small interface.

A replay does not judge records itself: it asks its `Rules` for a fresh fold, applies
records to it, snapshots and restores it, and asks for the words that explain one verdict.
qw's own rules are `QW_RULES`: the fold of queue_worker.protocol.state (`ClaimState`) and
the words of `qw why` (queue_worker.proof.explain). Another set of rules (the original
design's, without fencing) plugs in by providing the same: a state with `apply`, its
snapshot, and its words.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Final, NamedTuple, Protocol

from queue_worker.ops import OpRecord, held_by
from queue_worker.proof.explain import explain_batches
from queue_worker.protocol.records import ClaimsRecord
from queue_worker.protocol.state import ClaimSnapshot, ClaimState, Lease, Outcome


class FoldState(Protocol):
    """What a replay reads of a fold: the verdict of each record, and the state after it."""

    @property
    def done_count(self) -> int: ...

    @property
    def dead_count(self) -> int: ...

    def apply(self, record: ClaimsRecord, position: int) -> Outcome: ...

    def apply_all(
        self,
        records: Sequence[ClaimsRecord],
        positions: Sequence[int],
        others: list[tuple[ClaimsRecord, Outcome]] | None = None,
    ) -> None:
        """`apply` each record; `others` receives every outcome but a CLAIM's WON and a
        DONE's DONE (more may come: the replay counts DONEs by `done_count`)."""
        ...

    def held_tasks(self) -> Iterator[tuple[int, Lease]]: ...

    def attempts(self, task: int) -> int: ...


class Why(NamedTuple):
    """One record's verdict and the rule that decided it, in words."""

    verdict: str  # the verdict's word: "won", "stale done", …
    why: str


class Rules(Protocol):
    """A set of rules: a fold to step, its snapshots, and the words for one verdict."""

    name: str  # what --rules calls it
    title: str  # how the screen names it: "qw's rules"

    def fresh(self) -> FoldState: ...

    def snapshot(self, state: FoldState) -> object: ...

    def restore(self, snapshot: object) -> FoldState: ...

    def why(self, task: int, records: Sequence[ClaimsRecord], positions: Sequence[int]) -> Why:
        """The words for the last of `records`: every record about `task` up to it, in
        log order, with their positions (a task's verdicts depend on its records only)."""
        ...

    def ops_about(
        self,
        task: int,
        records: Sequence[ClaimsRecord],
        positions: Sequence[int],
        ops: Sequence[OpRecord],
    ) -> tuple[OpRecord, ...]:
        """Of `ops`, those done to a process while it held `task` (or after it lost it,
        when it wrote under its claim again): what following the task stops at."""
        ...


class QwRules:
    """qw's rules: the fold every worker runs (docs/protocol.md §3) and `qw why`'s words."""

    name = "qw"
    title = "qw's rules"

    def fresh(self) -> FoldState:
        return ClaimState()

    def snapshot(self, state: FoldState) -> object:
        assert isinstance(state, ClaimState)
        return state.snapshot()

    def restore(self, snapshot: object) -> FoldState:
        assert isinstance(snapshot, ClaimSnapshot)
        return ClaimState.restore(snapshot)

    def why(self, task: int, records: Sequence[ClaimsRecord], positions: Sequence[int]) -> Why:
        # `qw why`'s own teller, given the task's records only (explain_batches with
        # fold_others=False: the story is the same); the step of the last record is ours
        story = explain_batches(task, None, [(records, positions)], fold_others=False)
        last = positions[-1]
        step = next(s for s in reversed(story.steps) if s.position == last and s.kind != "CLOCK")
        return Why(step.verdict, step.why)

    def ops_about(
        self,
        task: int,
        records: Sequence[ClaimsRecord],
        positions: Sequence[int],
        ops: Sequence[OpRecord],
    ) -> tuple[OpRecord, ...]:
        # the ops `qw why` cites in the task's story (kind OP), matched back by time and
        # worker: the teller decides which ops are about the task
        story = explain_batches(task, None, [(records, positions)], ops, fold_others=False)
        cited = {(s.at, s.worker) for s in story.steps if s.kind == "OP" and s.worker}
        return tuple(
            op for op in ops if any(at == op.at and w and held_by(op, w) for at, w in cited)
        )


QW_RULES: Final = QwRules()
#: the rules `--rules` may name
RULES: Final[dict[str, Rules]] = {QW_RULES.name: QW_RULES}
