"""Task handlers: loading one by its "module:function" name, calling it, and what a failure
means for the retry schedule.

Two kinds of task, and of handler:

- a task by name (`Queue.task`, `f.enqueue(*args, **kwargs)`) names its function: a worker
  started with `qw up --app myjobs` runs it only when module `myjobs`'s queue registered
  that name (`NamedHandlers`), and refuses any other (a dead FAIL naming the function):
  it never imports a path read from the log. The function is called with the task's
  arguments, and with `ctx=` when it has a keyword parameter named ctx;
- a payload task (`Queue.enqueue(payload)`) is run by the one handler of `--handler`:

A handler of payloads is a function of the task's payload::

    def resize(payload): ...                     # the payload only
    def resize(payload, ctx): ...                # and a TaskContext (any second parameter)
    def resize(payload, *, ctx): ...             # or a keyword parameter named ctx

Its return value (anything msgpack can encode) is carried by the DONE record. A coroutine
function (`async def`) runs on the worker's event loop, one task at a time
(`queue_worker.worker.async_tasks`), and is cancelled when the lease is lost.

Attempts and failures. Every winning claim of a task is one attempt (the fold counts them:
`ClaimState.attempts`), however it ends, and `max_attempts` bounds them all alike:

- an exception fails the attempt: the FAIL record carries "Type: message" and the handler's
  traceback (its last lines, bounded: `records.traceback_text`), and the task may
  be retried after a backoff (`retry_at`) while attempts remain; the FAIL of attempt
  `max_attempts` is dead;
- a time limit (`--task-timeout`, or `@time_limit(seconds)` on the handler) fails the
  attempt the same way, "timed out after 30 s", written by the worker's watchdog under its
  claim; then the worker process ends (a Python thread cannot be stopped), see
  `queue_worker.worker.watchdog`;
- a worker that dies running the task (os._exit, a segfault, the OOM killer) writes
  nothing: its lease lapses and the next winning claim is the next attempt. A worker whose
  claim wins attempt `max_attempts + 1` does not run the task: it writes a dead FAIL saying
  that the earlier attempts' workers died (`attempts_used_up`). So a task whose handler
  kills its worker is run at most `max_attempts` times, like one that raises.

Cancellation: when the worker loses the lease (a renewal refused, another worker took the
task over, or the worker's own clock passed the lease's expiry: it was frozen or starved
past it), it sets `ctx.cancelled`. A handler that honours it stops by raising
`TaskCancelled` (`ctx.raise_if_cancelled()`, `ctx.sleep(s)`; both also ask whether the
lease has lapsed by the clock, so a `ctx.sleep` whose time ran out while the process was
stopped raises rather than returns): the worker then writes nothing, since the task belongs
to someone else now. A handler that returns normally has completed, cancelled or not: its
DONE is written, and the fold judges it (a stale DONE is refused and stays in the log as
evidence of work done twice).
"""

from __future__ import annotations

import importlib
import inspect
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple, Protocol, TypeVar

from queue_worker.errors import QwError
from queue_worker.errors import TaskCancelled as TaskCancelled
from queue_worker.protocol.clock import seconds_to_us
from queue_worker.protocol.records import TaskRecord, error_field, error_text, traceback_text


class HandlerLoadError(ValueError, QwError):
    """A handler spec that does not name a usable function."""


def _never() -> bool:
    return False


@dataclass(frozen=True)
class TaskContext:
    """What a handler may know about the attempt it runs in."""

    task_id: int
    attempt: int  # 1 for the first winning claim of this task, 2 for the next, …
    cancelled: threading.Event  # set when the lease is lost: stop and raise TaskCancelled
    worker_id: str
    work_ms: int = 400  # the worker's configured work time (the demo handler uses it)
    # Has the lease lapsed by the worker's clock? (Sets `cancelled` when it has: the
    # worker's `LeaseKeeper.check_lapse`.) Asked before sleep/raise_if_cancelled return.
    lease_lapsed: Callable[[], bool] = field(default=_never, compare=False, repr=False)

    def raise_if_cancelled(self) -> None:
        if self.cancelled.is_set() or self.lease_lapsed():
            raise TaskCancelled(self._why())

    def sleep(self, seconds: float) -> None:
        """Wait `seconds`, or raise TaskCancelled as soon as the lease is lost — also when
        the wait ends after the lease lapsed (the process was stopped meanwhile)."""
        if self.cancelled.wait(seconds) or self.lease_lapsed():
            raise TaskCancelled(self._why())

    def _why(self) -> str:
        return f"task {self.task_id}: the lease was lost"


CtxMode = Literal["none", "positional", "keyword"]


#: the attribute `time_limit` sets on a handler function
TIME_LIMIT_ATTRIBUTE: Final = "qw_time_limit_s"

F = TypeVar("F", bound=Callable[..., Any])


def time_limit(seconds: int | float) -> Callable[[F], F]:
    """Give a handler its own time limit, which overrides the worker's `--task-timeout`::

        @time_limit(30)
        def resize(payload): ...

    An attempt that runs longer fails ("timed out after 30 s") and its worker process is
    ended (see `queue_worker.worker.watchdog`)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise ValueError(f"time_limit is {seconds!r}; expected a number of seconds > 0")

    def mark(function: F) -> F:
        setattr(function, TIME_LIMIT_ATTRIBUTE, float(seconds))
        return function

    return mark


@dataclass(frozen=True)
class Handler:
    """A loaded handler and how it takes the context."""

    spec: str
    function: Callable[..., Any]
    ctx_mode: CtxMode
    time_limit_s: float | None = None  # its own time limit (`@time_limit`), if any
    #: a function by name (`Queue.task`): its registered name and its own max_attempts
    name: str | None = None
    max_attempts: int | None = None

    @property
    def in_hand_max_attempts(self) -> int | None:
        """The max_attempts the worker's FAIL goes by (None: the worker's own)."""
        return self.max_attempts

    def __call__(self, payload: Any, ctx: TaskContext) -> Any:
        if self.ctx_mode == "positional":
            return self.function(payload, ctx)
        if self.ctx_mode == "keyword":
            return self.function(payload, ctx=ctx)
        return self.function(payload)


@dataclass
class NamedHandlers:
    """The functions one queue registered (`Queue.task`), by name: what `qw up --app` runs."""

    spec: str
    handlers: Mapping[str, Handler]
    time_limit_s: None = None  # (each function has its own: `Handler.time_limit_s`)
    #: the max_attempts of the task in hand's function (None: the worker's), which the
    #: worker's FAIL of a failed attempt goes by (`run_task` sets it at each task)
    in_hand_max_attempts: int | None = None

    def names_text(self) -> str:
        return ", ".join(sorted(self.handlers)) or "none"


class Registry(Protocol):
    """What `load_handler` asks of a queue object it finds (`queue_worker.producer.Queue`)."""

    def handlers(self, spec: str) -> Mapping[str, Handler]: ...


def load_handlers(spec: str) -> Handler | NamedHandlers:
    """What a worker runs: `load_handler(spec)`, or, when `spec` names a queue
    ("myjobs:queue", as `qw up --app myjobs` finds it), every function it registered."""
    target = _import_target(spec)
    if isinstance(target, NamedHandlers):
        return target
    return _handler_of(spec, target)


def load_handler(spec: str) -> Handler:
    """Import "module:function" (the function may be a dotted path: "module:Class.method")."""
    target = _import_target(spec)
    if isinstance(target, NamedHandlers):
        raise HandlerLoadError(
            f"handler {spec!r} is a queue, not a function; expected qw up --app for a queue"
        )
    return _handler_of(spec, target)


def _import_target(spec: str) -> Any:
    """What "module:attribute" names: a function, or a queue's NamedHandlers."""
    module_name, sep, attr_path = spec.partition(":")
    if not (sep and module_name and attr_path):
        raise HandlerLoadError(f"handler {spec!r} is malformed; expected 'module:function'")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise HandlerLoadError(
            f"handler {spec!r}: cannot import module {module_name!r} ({e}); "
            "expected an importable module"
        ) from e
    for part in attr_path.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise HandlerLoadError(
                f"handler {spec!r}: {module_name!r} has no attribute {attr_path!r}; "
                "expected a function of that name"
            ) from None
    if hasattr(target, "handlers") and hasattr(target, "task"):  # a Queue: its functions
        registry: Registry = target
        named = NamedHandlers(spec, registry.handlers(spec))
        if not named.handlers:
            raise HandlerLoadError(
                f"handler {spec!r} is a queue that registered no task; "
                "expected functions decorated with @queue.task"
            )
        return named
    return target


def _handler_of(spec: str, target: Any) -> Handler:
    if not callable(target):
        raise HandlerLoadError(
            f"handler {spec!r} is a {type(target).__name__}, not callable; "
            "expected a function taking (payload) or (payload, ctx)"
        )
    return Handler(spec, target, _ctx_mode(spec, target), _time_limit_of(spec, target))


def handler_from_function(function: Callable[..., Any], spec: str | None = None) -> Handler:
    """A handler from a function already in hand (tests, embedding a worker)."""
    name = spec if spec is not None else getattr(function, "__qualname__", repr(function))
    return Handler(name, function, _ctx_mode(name, function), _time_limit_of(name, function))


def _time_limit_of(spec: str, function: Callable[..., Any]) -> float | None:
    limit = getattr(function, TIME_LIMIT_ATTRIBUTE, None)
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, int | float) or not limit > 0:
        raise HandlerLoadError(
            f"handler {spec!r} has {TIME_LIMIT_ATTRIBUTE} = {limit!r}; "
            "expected a number of seconds > 0"
        )
    return float(limit)


def _ctx_mode(spec: str, function: Callable[..., Any]) -> CtxMode:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # some builtins have no signature: pass the payload
        return "none"
    params = list(signature.parameters.values())
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    var_positional = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
    if not positional and not var_positional:
        raise HandlerLoadError(
            f"handler {spec!r} takes no positional parameter; "
            "expected a function taking (payload) or (payload, ctx)"
        )
    if len(positional) >= 2 or var_positional:
        return "positional"
    ctx = signature.parameters.get("ctx")
    if ctx is not None and ctx.kind is inspect.Parameter.KEYWORD_ONLY:
        return "keyword"
    return "none"


class HandlerOutcome(NamedTuple):
    """What one call of a handler came to: a result, or an error (with the exception). (A
    NamedTuple: one is made every task, and a frozen dataclass is slower to build; and
    built with `_new` on a task's path.)"""

    result: Any = None
    error: str | None = None
    exception: BaseException | None = None
    permanent: bool = False  # retrying cannot help (an unreadable task): fail it for good

    @property
    def ok(self) -> bool:
        return self.error is None


def run_handler(handler: Handler, payload: Any, ctx: TaskContext) -> HandlerOutcome:
    """Call the handler; an exception becomes a failed outcome (never propagates)."""
    try:
        result = handler(payload, ctx)
        if inspect.iscoroutine(result):
            result = _awaited(result, ctx)
    except Exception as e:  # any handler failure is the task's failure, not the worker's
        return HandlerOutcome(error=error_text(e), exception=e)
    return _new(HandlerOutcome, (result, None, None, False))  # result, error, exception, permanent


class RunningLimit(Protocol):
    """The watchdog's hold on the task in hand (`TimeLimits.limit_running`)."""

    def limit_running(self, limit_s: float) -> None: ...


def run_task(
    handler: Handler | NamedHandlers,
    record: TaskRecord,
    ctx: TaskContext,
    limits: RunningLimit | None = None,
) -> HandlerOutcome:
    """Run the task `record`: a payload task by the one handler, a task by name by the
    function registered under its name, with the function's own time limit (`limits`: the
    watchdog that enforces it) and max_attempts. A task whose function this worker does not
    have is refused for good (a dead FAIL naming it): never imported, never guessed."""
    if isinstance(handler, NamedHandlers):
        handler.in_hand_max_attempts = None
    if record.resolves_to is not None:  # a later task of a key: the first one is the task
        return _new(HandlerOutcome, (resolved_result(record.resolves_to), None, None, False))
    if record.function is None:
        if isinstance(handler, Handler):
            return run_handler(handler, record.payload, ctx)
        return _refused(
            f"task {ctx.task_id} is a payload task (it names no function), and this worker "
            f"runs only the functions {handler.spec} registered ({handler.names_text()}); "
            "payload tasks need qw up --handler MODULE:FUNCTION"
        )
    target = _target(handler, record.function)
    if target is None:
        has = handler.names_text() if isinstance(handler, NamedHandlers) else handler.spec
        return _refused(
            f"task {ctx.task_id} names function {record.function!r}, which this worker does "
            f"not have (it runs: {has}); expected a function registered by the app's queue"
        )
    own = target.max_attempts
    if isinstance(handler, NamedHandlers):
        handler.in_hand_max_attempts = own
    if own is not None and ctx.attempt > own:  # the earlier attempts' workers died
        runs = ctx.attempt - 1
        return _refused(
            f"attempts used up: run {runs} time{'s' * (runs != 1)} (max_attempts {own})"
        )
    if target.time_limit_s is not None and limits is not None:
        limits.limit_running(target.time_limit_s)
    try:
        if target.ctx_mode == "keyword":
            result = target.function(*record.args, **record.kwargs, ctx=ctx)
        else:
            result = target.function(*record.args, **record.kwargs)
        if inspect.iscoroutine(result):
            result = _awaited(result, ctx)
    except Exception as e:  # any handler failure is the task's failure, not the worker's
        permanent = own is not None and ctx.attempt >= own
        return HandlerOutcome(error=error_text(e), exception=e, permanent=permanent)
    return _new(HandlerOutcome, (result, None, None, False))


#: the result of a later task of a key, recorded without running it: {RESOLVED_TO: first}
RESOLVED_TO: Final = "qw:resolved_to"


def resolved_result(first: int) -> dict[str, int]:
    """The DONE's result of a task that resolves to task `first` (same key, earlier)."""
    return {RESOLVED_TO: first}


def resolved_to(result: Any) -> int | None:
    """The task a DONE's result says its task resolved to (a later task of a key), or
    None: the result of a run."""
    if type(result) is dict and len(result) == 1:
        first = result.get(RESOLVED_TO)
        return first if type(first) is int else None
    return None


def _target(handler: Handler | NamedHandlers, name: str) -> Handler | None:
    if isinstance(handler, NamedHandlers):
        return handler.handlers.get(name)
    return handler if handler.name == name else None


def _refused(error: str) -> HandlerOutcome:
    return HandlerOutcome(error=error_field(error), permanent=True)


def _awaited(coroutine: Any, ctx: TaskContext) -> Any:
    from queue_worker.worker.async_tasks import run_coroutine  # (async tasks only)

    return run_coroutine(coroutine, ctx)


def failure_traceback(exc: BaseException | None) -> str | None:
    """The traceback a failed attempt's FAIL carries: the handler's, from its own frame on
    (not the worker's call of it), bounded; None when no handler raised."""
    tb = None if exc is None else exc.__traceback__
    if exc is None or tb is None or tb.tb_frame.f_code.co_filename != __file__:
        return None  # (raised by the worker's code: a result it could not record, say)
    return traceback_text(exc, tb.tb_next)


#: a NamedTuple built with every field given: tuple.__new__ is one C call, where the
#: NamedTuple's own __new__ (with keywords) is a Python function: ~2.6k instructions a task
_new: Final = tuple.__new__


def backoff_us(attempt: int, backoff_s: float, backoff_max_s: float, rng: random.Random) -> int:
    """Full jitter: uniform in [0, min(backoff_max_s, backoff_s * 2**(attempt-1))] seconds."""
    exponent = min(max(attempt - 1, 0), 64)  # 2**64 * any base is past any maximum anyway
    ceiling = min(backoff_max_s, backoff_s * 2.0**exponent)
    return seconds_to_us(rng.uniform(0.0, ceiling))


def retry_at(
    at: int,
    attempt: int,
    *,
    max_attempts: int,
    backoff_s: float,
    backoff_max_s: float,
    rng: random.Random,
    permanent: bool = False,
) -> int | None:
    """When a task that failed attempt `attempt` at `at` (µs) may be tried again, or None
    when it is dead: its attempts are used up, or the failure is permanent."""
    if permanent or attempt >= max_attempts:
        return None
    return at + backoff_us(attempt, backoff_s, backoff_max_s, rng)


def seconds_text(seconds: float) -> str:
    """30 -> "30 s", 0.5 -> "0.5 s": a duration in an error text."""
    return f"{seconds:g} s"


def timed_out_error(limit_s: float) -> str:
    """The error of an attempt ended by its time limit."""
    return f"timed out after {seconds_text(limit_s)}"


def attempts_used_up(
    attempts: int, max_attempts: int, died: str | None, last_error: str | None
) -> str:
    """The error of the dead FAIL written, without running the task, by the claim that won
    attempt `attempts` > `max_attempts`.

    `died` names (as people read it) the worker whose lease this claim took over: that
    attempt wrote no result and no error, so its worker died or stopped renewing its lease
    while running it (a FAIL of the last attempt is dead already). That, and the error of an
    earlier attempt, is what the claims log knows; the cause of a death (a signal, say) is
    the supervisor's to tell. `died` is None when no lease was taken over (the attempts were
    used up under a larger max_attempts)."""
    runs = f"attempts used up: run {attempts - 1} time{'s' * (attempts != 2)}"
    text = f"{runs} (max_attempts {max_attempts})"
    if died is not None:
        text += f"; the last run's worker ({died}) died or stopped renewing its lease running it"
    if last_error:
        text += f"; an earlier attempt failed with: {last_error}"
    return error_field(text)


class DemoFailure(Exception):
    """The failure the demo handler raises when the payload asks for one."""


def demo(payload: Any, ctx: TaskContext) -> dict[str, Any]:
    """The default handler: work for `work_ms` (the payload's {"work_ms": n}, else the
    worker's), stop at once when cancelled, and fail when the payload says {"fail": true}."""
    # the result says what was asked ({"worked_ms": 10}, not 10.0)
    work_ms: int | float = ctx.work_ms
    requested = payload.get("work_ms") if isinstance(payload, dict) else None
    if isinstance(requested, int | float) and not isinstance(requested, bool) and requested >= 0:
        work_ms = requested
    ctx.sleep(work_ms / 1000)
    if isinstance(payload, dict) and payload.get("fail") is True:
        raise DemoFailure(f"task {ctx.task_id} asked to fail (attempt {ctx.attempt})")
    return {"task": ctx.task_id, "worked_ms": work_ms}


def named_handler(
    name: str,
    function: Callable[..., Any],
    *,
    max_attempts: int | None = None,
    timeout_s: float | None = None,
) -> Handler:
    """The handler of a function registered by name: called with the task's arguments, and
    with `ctx=` when it has a keyword-only parameter named ctx."""
    try:
        ctx = inspect.signature(function).parameters.get("ctx")
    except (TypeError, ValueError):  # some builtins have no signature
        ctx = None
    mode: CtxMode = "keyword" if ctx is not None and ctx.kind is ctx.KEYWORD_ONLY else "none"
    limit = timeout_s if timeout_s is not None else _time_limit_of(name, function)
    return Handler(name, function, mode, limit, name, max_attempts)
