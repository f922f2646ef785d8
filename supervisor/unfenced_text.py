"""The comparison of qw's rules with the original's, in plain words (`qw report --rules
unfenced`, `qw timeline --rules unfenced --text`, `qw demo pause`).

Each difference is one line: the record (task, worker as people see it, kind, position),
what qw's fold decided and why, in `qw why`'s words (queue_worker.proof.explain), then what
the original's rules (queue_worker.proof.unfenced) decide and what follows from it.
"""

from __future__ import annotations

import textwrap
from typing import Any, Final

from queue_worker.names import worker_label
from queue_worker.proof.unfenced import Comparison, Difference, UnfencedVerdict
from queue_worker.protocol.records import Cancel, Claim, Done
from queue_worker.protocol.state import Lease, Verdict
from queue_worker.times import clock_text

#: the rule sets `--rules` takes: qw's own, or the original's beside them
RULES: Final = ("qw", "unfenced")

UNFENCED_TITLE: Final = (
    "the same log under unfenced rules (the original's: a DONE is accepted from anyone "
    "who names the task; owners are names; no renewal):"
)

_TIMES: Final = {2: "twice", 3: "three times"}


def _lease_text(lease: Lease) -> str:
    return f"{worker_label(lease.worker)} (claim @{lease.claim})"


def _positions(positions: tuple[int, ...]) -> str:
    """(207, 958) -> "@207 and @958"; (1, 2, 3) -> "@1, @2 and @3" """
    shown = [f"@{p}" for p in positions]
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"


def completed_text(task: int, completions: tuple[int, ...]) -> str:
    """ "task 0 would have been completed twice (@207 and @958)" """
    times = _TIMES.get(len(completions), f"{len(completions)} times")
    return f"task {task} would have been completed {times} ({_positions(completions)})"


def _kind(d: Difference) -> str:
    if isinstance(d.record, Claim):
        return "CLAIM"
    if isinstance(d.record, Done):
        return "DONE"
    return "CANCEL" if type(d.record) is Cancel else "FAIL"


def _qw_words(d: Difference) -> str:
    o, r = d.qw, d.record
    v = o.verdict
    if v is Verdict.STALE_DONE:
        assert isinstance(r, Done)
        if o.holder is not None:
            now = f"the holder is {_lease_text(o.holder)}"
        elif d.qw_done is not None:
            now = f"the task was already done @{d.qw_done}"
        else:
            now = "nobody holds the task"
        return (
            f"refused as stale under qw's rules (its token @{r.claim} no longer holds the "
            f"task; {now})"
        )
    if v is Verdict.DONE:
        assert isinstance(r, Done)
        return f"accepted from the holder (claim @{r.claim}) under qw's rules"
    if v is Verdict.LOST_HELD and o.holder is not None:
        return (
            f"lost under qw's rules: held by {_lease_text(o.holder)} until "
            f"{clock_text(o.holder.expiry)}"
        )
    if v is Verdict.LOST_DONE and d.qw_done is not None:
        return f"lost under qw's rules: the task was already done @{d.qw_done}"
    if v is Verdict.TAKEOVER and o.previous is not None:
        return f"won under qw's rules, a takeover of {_lease_text(o.previous)}"
    return f"'{v.value}' under qw's rules"


def _unfenced_words(d: Difference) -> str:
    o = d.unfenced
    v = o.verdict
    twice = len(d.completions) > 1
    if v is UnfencedVerdict.DONE:
        text = "accepted under unfenced rules"
        if twice:
            return f"{text}, so {completed_text(d.task, d.completions)}"
        return f"{text} (from anyone who names the task): task {d.task} done"
    if v is UnfencedVerdict.DONE_AGAIN:
        return f"accepted again under unfenced rules, so {completed_text(d.task, d.completions)}"
    if v is UnfencedVerdict.LOST_HELD and o.holder is not None:
        return (
            f"lost under unfenced rules: held by {worker_label(o.holder.worker)} until "
            f"{clock_text(o.holder.expiry)}, as its CLAIM @{o.holder.claim} set it"
        )
    if v is UnfencedVerdict.LOST_DONE and o.completions:
        return f"lost under unfenced rules: the task was already done @{o.completions[0]}"
    if v is UnfencedVerdict.TAKEOVER and o.previous is not None:
        return (
            f"won under unfenced rules, a takeover of {worker_label(o.previous.worker)}: "
            f"with no renewal its lease ended at {clock_text(o.previous.expiry)}, as its "
            f"CLAIM @{o.previous.claim} set it"
        )
    if v is UnfencedVerdict.WON:
        return "won under unfenced rules: nobody held it"
    return f"'{v.value}' under unfenced rules"


def difference_text(d: Difference) -> str:
    """ "task 0: w0·15186's DONE @207 — refused as stale under qw's rules (…); accepted
    under unfenced rules, so task 0 would have been completed twice (@207 and @958)" """
    who = worker_label(d.record.worker)
    return f"task {d.task}: {who}'s {_kind(d)} @{d.position} — {_qw_words(d)}; {_unfenced_words(d)}"


def summary_text(c: Comparison) -> str:
    """One line: how many records differ, and the tasks completed more than once."""
    if not c.differences:
        return f"both rule sets reach the same verdict on every one of the {c.records} records"
    n = len(c.differences)
    text = f"{n} record{'s' if n != 1 else ''} judged differently"
    if c.completed_twice:
        tasks = ", ".join(str(t) for t in c.completed_twice)
        text += f"; without fencing, completed more than once: task {tasks}"
    return text


def comparison_lines(c: Comparison) -> list[str]:
    """The title, each difference, and the summary."""
    return [UNFENCED_TITLE, *(difference_text(d) for d in c.differences), summary_text(c)]


def wrapped_lines(c: Comparison, width: int) -> list[str]:
    """`comparison_lines` wrapped to `width` columns, each difference's lines after its
    first indented under it."""
    return [
        textwrap.fill(line, width, subsequent_indent="  " if i else "", break_on_hyphens=False)
        for i, line in enumerate(comparison_lines(c))
    ]


def comparison_json(c: Comparison) -> dict[str, Any]:
    return {
        "records": c.records,
        "differences": [
            {
                "task": d.task,
                "position": d.position,
                "kind": _kind(d),
                "worker": d.record.worker,
                "label": worker_label(d.record.worker),
                "qw": d.qw.verdict.value,
                "unfenced": d.unfenced.verdict.value,
                "completions": list(d.completions),
                "text": difference_text(d),
            }
            for d in c.differences
        ],
        "completed_twice": {str(t): list(p) for t, p in c.completed_twice.items()},
        "summary": summary_text(c),
    }
