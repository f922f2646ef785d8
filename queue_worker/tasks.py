"""Tasks by name: `@queue.task` registers a function under its name, and
`f.enqueue(*args, **kwargs)` writes a task naming it with its arguments.

A task's name is its function's `__name__` (`name=` chooses another): the same in the
program that enqueues (`from myjobs import resize`) and in the workers (`qw up --app
myjobs`), whatever the module is called where it is defined (`__main__` when it is run as a
script). One queue registers a name once: a second function of the same name is refused
when it is registered. A worker runs a task only if its queue registered the task's name
(`queue_worker.worker.handlers.run_task`); the log never names a module to import.

    queue = Queue(".qw")

    @queue.task(max_attempts=5, timeout=30)
    def resize(path, width=800): ...

    handle = resize.enqueue("a.png", width=400)
    handle.result(timeout=60)

The arguments and the result travel as msgpack (the TASK and DONE records): what msgpack
cannot encode is refused at enqueue, with nothing written (RecordEncodeError).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Generic, ParamSpec, TypeVar

from queue_worker.worker.handlers import Handler, named_handler

if TYPE_CHECKING:
    from queue_worker.producer import Queue
    from queue_worker.results import TaskHandle

P = ParamSpec("P")
R = TypeVar("R")

#: keyword arguments of `enqueue` that are options of the task, not arguments of the
#: function (never passed on to it): these it takes ...
OPTIONS: Final = ("delay", "eta", "priority", "key", "after")


class TaskFunction(Generic[P, R]):
    """A function registered with a queue: call it to run it here, now; `enqueue` it to
    have a worker run it."""

    def __init__(
        self,
        queue: Queue,
        function: Callable[P, R],
        name: str,
        max_attempts: int | None,
        timeout: float | None,
    ) -> None:
        if not name:
            raise ValueError("task name is empty; expected a function's name")
        if max_attempts is not None and (type(max_attempts) is not int or max_attempts < 1):
            raise ValueError(f"max_attempts is {max_attempts!r}; expected an integer >= 1")
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0
        ):
            raise ValueError(f"timeout is {timeout!r}; expected a number of seconds > 0")
        self.queue = queue
        self.function = function
        self.name = name
        self.max_attempts = max_attempts
        self.timeout = None if timeout is None else float(timeout)
        functools.update_wrapper(self, function)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.function(*args, **kwargs)

    def enqueue(self, *args: Any, **kwargs: Any) -> TaskHandle:
        """Append a task calling this function with these arguments; its handle.

        Options (keywords the function never sees): `delay` (seconds from now, >= 0) or
        `eta` (an aware datetime): no worker tries it before then; `priority` (an integer,
        0 by default): the due tasks of a higher one are tried first (see
        queue_worker.worker.pick); `key` (a string): of the tasks with one key, the first
        in the tasks log is the task, and enqueueing another returns its handle (an
        idempotent enqueue, for producers that retry); `after` (handles or task ids of
        tasks already enqueued): no worker tries it before they are all done, and it is
        dead if one of them is (see queue_worker.worker.dependencies)."""
        options = {k: kwargs.pop(k) for k in OPTIONS if k in kwargs}
        return self.queue.enqueue_call(self.name, args, kwargs, **options)

    def handler(self) -> Handler:
        """How a worker runs it."""
        return named_handler(
            self.name, self.function, max_attempts=self.max_attempts, timeout_s=self.timeout
        )

    def __repr__(self) -> str:
        return f"<task {self.name}>"
