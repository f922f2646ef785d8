"""The package's root error, and the log errors after which a worker cannot go on.

`QwError` is the base of every error queue_worker raises on purpose: catch it to catch any
of them. An error that is also a `logstore.LogError` (the log failed under us) keeps that
base too, and one that callers catch as `ValueError` (a record that does not decode) keeps
that one: `QwError` is added beside them, never instead.

This module imports only logstore, so that every module of the package can import it.
"""

from __future__ import annotations

from typing import Final

from logstore import CorruptLogError, ForeignFileError, IdentityError, LogClosedError


class QwError(Exception):
    """The root of the errors queue_worker raises."""


#: Errors after which a log handle cannot be used again: a worker exits, and a lease keeper
#: stops renewing (and cancels the handler). Other LogErrors (an append that did not land, a
#: server out of reach) may pass, and are retried after a pause.
FATAL_LOG_ERRORS: Final = (CorruptLogError, ForeignFileError, IdentityError, LogClosedError)
