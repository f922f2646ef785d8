"""The claims records decoded in C (`queue_worker/protocol/_cdecode.c`), where the install built it.

Every worker decodes every claims record, and a replay decodes a whole log:
`records.decode_claims_all` hands a read's payloads to the C decoder when it was built (an
optional extension: setup.py). The C file knows only the common records (a well-formed
CLAIM or DONE, packed as msgpack packs them) and hands every other payload back to
`records.py`, which stays the definition of the records and of their errors.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def load() -> ModuleType | None:
    """The C decoder's module when built. records.py loads it at its first decode of claims
    records, not at its import."""
    try:
        return importlib.import_module("queue_worker.protocol._cdecode")
    except ModuleNotFoundError as e:
        if e.name != "queue_worker.protocol._cdecode":
            raise
        return None


def status() -> str:
    return "C (queue_worker/protocol/_cdecode.c)" if load() is not None else "Python (no C build)"
