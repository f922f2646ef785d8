"""`async def` tasks: run on the worker's event loop, one at a time, and cancelled when the
lease is lost.

A worker runs one task at a time, so one event loop per thread (kept
for the thread's life: a coroutine's loop-bound resources, a client session opened at the
first task, serve the next ones) runs each coroutine to its end. The lease keeper sets
`ctx.cancelled` from its own thread; the loop looks at it every CANCEL_POLL_S while the
coroutine runs and then cancels it (`asyncio.Task.cancel`): the coroutine sees
`CancelledError` at its next await, and the attempt ends as `TaskCancelled`, writing
nothing, as a synchronous handler that honours `ctx` does. A time limit is enforced as for
any task, by the watchdog ending the process (`queue_worker.worker.watchdog`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Final

from queue_worker.errors import TaskCancelled

if TYPE_CHECKING:
    from queue_worker.worker.handlers import TaskContext

#: how often the loop looks whether the lease was lost while a coroutine runs
CANCEL_POLL_S: Final = 0.05

_LOOPS = threading.local()


def run_coroutine(coroutine: Coroutine[Any, Any, Any], ctx: TaskContext) -> Any:
    """Run `coroutine` to its end on this thread's event loop; its result, or what it
    raised (TaskCancelled when the lease was lost and it was cancelled)."""
    loop: asyncio.AbstractEventLoop | None = getattr(_LOOPS, "loop", None)
    if loop is None or loop.is_closed():
        loop = _LOOPS.loop = asyncio.new_event_loop()
    return loop.run_until_complete(_watched(coroutine, ctx))


async def _watched(coroutine: Coroutine[Any, Any, Any], ctx: TaskContext) -> Any:
    task = asyncio.ensure_future(coroutine)
    while True:
        done, _ = await asyncio.wait({task}, timeout=CANCEL_POLL_S)
        if done:
            return task.result()
        if ctx.cancelled.is_set() or ctx.lease_lapsed():
            task.cancel()
            try:
                return await task  # (it may finish all the same, catching the cancel)
            except asyncio.CancelledError:
                raise TaskCancelled(f"task {ctx.task_id}: the lease was lost") from None
