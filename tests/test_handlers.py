"""Handlers: loading by name, how the context is passed, failures, backoff, the demo handler."""

from __future__ import annotations

import dataclasses
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from logstore import MemoryLog
from queue_worker.producer import Queue
from queue_worker.protocol.records import Fail, decode, encode, error_text
from queue_worker.worker.config import WorkerConfig
from queue_worker.worker.handlers import (
    DemoFailure,
    HandlerLoadError,
    TaskCancelled,
    TaskContext,
    backoff_us,
    demo,
    handler_from_function,
    load_handler,
    retry_at,
    run_handler,
)
from queue_worker.worker.loop import StepKind, Worker

NOT_CALLABLE = 42


def payload_only(payload: Any) -> Any:
    return ("payload only", payload)


def with_ctx(payload: Any, ctx: TaskContext) -> Any:
    return ("with ctx", payload, ctx.task_id, ctx.attempt)


def keyword_ctx(payload: Any, *, ctx: TaskContext) -> Any:
    return ("keyword ctx", payload, ctx.worker_id)


def star_args(*args: Any) -> Any:
    return ("star args", len(args))


def no_parameters() -> None:
    return None


def raises(payload: Any) -> None:
    raise ValueError(f"bad payload\n{payload!r}")


class Handlers:
    @staticmethod
    def nested(payload: Any) -> Any:
        return ("nested", payload)


def ctx_for(task: int = 7, attempt: int = 1, work_ms: int = 400) -> TaskContext:
    return TaskContext(task, attempt, threading.Event(), "w0-1-abcd", work_ms)


# -- loading ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("no_colon", "expected 'module:function'"),
        (":demo", "expected 'module:function'"),
        ("tests.test_handlers:", "expected 'module:function'"),
        ("tests.no_such_module:f", "cannot import module 'tests.no_such_module'"),
        ("tests.test_handlers:missing", "has no attribute 'missing'"),
        ("tests.test_handlers:NOT_CALLABLE", "is a int, not callable"),
        ("tests.test_handlers:no_parameters", "takes no positional parameter"),
    ],
)
def test_load_errors_name_the_spec_and_what_was_expected(spec: str, expected: str) -> None:
    with pytest.raises(HandlerLoadError) as info:
        load_handler(spec)
    message = str(info.value)
    assert expected in message
    assert repr(spec) in message
    assert "\n" not in message


def test_a_load_error_is_a_value_error() -> None:
    # the worker process reports ValueErrors from its setup as configuration errors
    assert issubclass(HandlerLoadError, ValueError)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("tests.test_handlers:payload_only", ("payload only", "p")),
        ("tests.test_handlers:with_ctx", ("with ctx", "p", 7, 2)),
        ("tests.test_handlers:keyword_ctx", ("keyword ctx", "p", "w0-1-abcd")),
        ("tests.test_handlers:star_args", ("star args", 2)),
        ("tests.test_handlers:Handlers.nested", ("nested", "p")),
    ],
)
def test_the_context_is_passed_when_the_signature_asks_for_it(spec: str, expected: Any) -> None:
    handler = load_handler(spec)
    assert handler(payload="p", ctx=ctx_for(attempt=2)) == expected


def test_the_default_handler_loads() -> None:
    handler = load_handler("queue_worker.worker.handlers:demo")
    assert handler.ctx_mode == "positional"


def test_a_builtin_without_a_signature_gets_the_payload() -> None:
    handler = handler_from_function(len)
    assert handler([1, 2, 3], ctx_for()) == 3


def test_the_context_is_a_frozen_dataclass_of_the_fields_given() -> None:
    """A handler sees the fields given, equal contexts compare and hash alike, and no field
    can be assigned."""
    cancelled = threading.Event()
    ctx = TaskContext(7, 2, cancelled, "w0-1-abcd", 15, lease_lapsed=lambda: True)
    fields = (ctx.task_id, ctx.attempt, ctx.cancelled, ctx.worker_id, ctx.work_ms)
    assert fields == (7, 2, cancelled, "w0-1-abcd", 15)
    assert ctx.lease_lapsed()
    same = TaskContext(7, 2, cancelled, "w0-1-abcd", 15)  # (lease_lapsed is not compared)
    assert ctx == same and hash(ctx) == hash(same)
    assert ctx != dataclasses.replace(ctx, attempt=3)
    assert TaskContext(7, 2, cancelled, "w").work_ms == 400
    assert repr(ctx).startswith("TaskContext(task_id=7, attempt=2, cancelled=")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ctx.task_id = 8  # type: ignore[misc]
    assert ctx.task_id == 7


# -- running -----------------------------------------------------------------------------------


def test_an_exception_becomes_a_one_line_type_and_message() -> None:
    outcome = run_handler(load_handler("tests.test_handlers:raises"), {"a": 1}, ctx_for())
    assert not outcome.ok
    assert outcome.error == "ValueError: bad payload {'a': 1}"
    assert isinstance(outcome.exception, ValueError)


def test_a_result_builds_a_whole_outcome() -> None:
    """(Built with tuple.__new__ on the task's path: every field given, as the NamedTuple
    would give them.)"""
    outcome = run_handler(handler_from_function(payload_only), 5, ctx_for())
    assert tuple(outcome) == (("payload only", 5), None, None, False)
    assert outcome.ok and not outcome.permanent and outcome.exception is None


def test_error_text_is_bounded_and_names_the_type_alone_without_a_message() -> None:
    assert error_text(KeyError()) == "KeyError"
    assert len(error_text(RuntimeError("x" * 10_000))) <= 1000


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no")


def test_error_text_never_raises_and_always_encodes_in_a_fail() -> None:
    assert error_text(_Unprintable()) == (
        "_Unprintable: (its message cannot be read: str() raised RuntimeError)"
    )
    text = error_text(ValueError("bad \udc80 byte"))  # a lone surrogate: not UTF-8
    assert text == "ValueError: bad \\udc80 byte"
    assert decode(encode(Fail(0, "w", 1, 0, text, None))) == Fail(0, "w", 1, 0, text, None)


def test_a_result_comes_back() -> None:
    outcome = run_handler(handler_from_function(payload_only), 5, ctx_for())
    assert outcome.ok
    assert outcome.result == ("payload only", 5)


def test_an_unencodable_result_fails_the_task_with_that_error(tmp_path: Path) -> None:
    tasks, claims = MemoryLog("tasks"), MemoryLog("claims")
    Queue("memory", tasks_log=tasks).enqueue("x")
    config = WorkerConfig("memory", str(tmp_path / "run"), max_attempts=1)
    worker = Worker(config, tasks_log=tasks, claims_log=claims, handler=lambda p: object())
    result = worker.step()
    assert result.kind is StepKind.DEAD
    assert result.error is not None
    assert result.error.startswith("result cannot be recorded: ")
    assert worker.claims.state.dead_error(0) == result.error


# -- backoff -----------------------------------------------------------------------------------


@pytest.mark.parametrize("attempt", [1, 2, 3, 5, 8, 40, 10_000])
def test_backoff_is_full_jitter_below_the_capped_exponential(attempt: int) -> None:
    rng = random.Random(attempt)
    base, cap = 0.5, 20.0
    ceiling_us = min(cap, base * 2 ** min(attempt - 1, 100)) * 1_000_000
    samples = [backoff_us(attempt, base, cap, rng) for _ in range(500)]
    assert all(0 <= s <= ceiling_us for s in samples)
    # full jitter spreads over the whole range rather than clustering at the ceiling
    assert min(samples) < ceiling_us / 4
    assert max(samples) > ceiling_us * 3 / 4


def test_retry_at_is_after_at_until_the_attempts_are_used_up() -> None:
    rng = random.Random(1)
    kwargs: dict[str, Any] = {"max_attempts": 3, "backoff_s": 1.0, "backoff_max_s": 60.0}
    at = 1_000_000_000
    first = retry_at(at, 1, rng=rng, **kwargs)
    second = retry_at(at, 2, rng=rng, **kwargs)
    assert first is not None and at <= first <= at + 1_000_000
    assert second is not None and at <= second <= at + 2_000_000
    assert retry_at(at, 3, rng=rng, **kwargs) is None
    assert retry_at(at, 1, rng=rng, permanent=True, **kwargs) is None


def test_zero_backoff_retries_at_once() -> None:
    assert retry_at(5, 1, max_attempts=2, backoff_s=0, backoff_max_s=0, rng=random.Random()) == 5


# -- the demo handler ------------------------------------------------------------------------


def test_demo_works_for_the_payloads_time_and_reports_it() -> None:
    assert demo({"work_ms": 0}, ctx_for(task=3)) == {"task": 3, "worked_ms": 0}


def test_demo_fails_when_the_payload_asks() -> None:
    with pytest.raises(DemoFailure, match="task 3 asked to fail"):
        demo({"fail": True, "work_ms": 0}, ctx_for(task=3))


def test_demo_stops_at_once_when_cancelled() -> None:
    ctx = ctx_for(work_ms=3_600_000)  # an hour: only cancellation can end it within the test
    ctx.cancelled.set()
    with pytest.raises(TaskCancelled):
        demo("anything", ctx)


def test_demo_uses_the_workers_work_time_without_one_in_the_payload() -> None:
    assert demo(None, ctx_for(work_ms=0)) == {"task": 7, "worked_ms": 0}
