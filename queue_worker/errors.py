"""The package's root error.

`QwError` is the base of every error queue_worker raises on purpose: catch it to catch any
of them. An error that is also a `logstore.LogError` (the log failed under us) keeps that
base too, and one that callers catch as `ValueError` (a record that does not decode) keeps
that one: `QwError` is added beside them, never instead.

This module imports nothing, so that every module of the package (the records, the fold)
can import it without loading more.
"""


class QwError(Exception):
    """The root of the errors queue_worker raises."""


class TaskCancelled(QwError):
    """Raised by a handler that stops because its worker lost the lease (here, not with the
    handlers, so that the code that runs an `async def` task can raise it too)."""
