"""The claims records decoded in C (`queue_worker/_cdecode.c`), used only for its exact sources.

Every worker decodes every claims record, and a replay decodes a whole log:
`records.decode_claims_all` hands a read's payloads to the C decoder when a build of the
current sources exists. The C file knows only the common records (a well-formed CLAIM or
DONE, packed as msgpack packs them) and hands every other payload back to `records.py`, which
stays the definition of the records and of their errors.

The key hashes the C file and `records.py` (the definition it must agree with): an edit to
either means no build of that key exists, and the Python decoder runs (as with `QW_PURE=1`,
or where the build could not run). Built by `python -m queue_worker.build_compiled` into
`queue_worker/_compiled_c/<key>/`, never next to the sources (see `logstore.native`).
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Final

from logstore.native import EXT_SUFFIX, find_build, key_of, load_extension

MODULE: Final = "queue_worker._cdecode"
PACKAGE_DIR: Final = os.path.dirname(os.path.abspath(__file__))
#: the C file first, then the definitions it must agree with: records.py, and for
#: `decode_claims_frames` its twin (claims_span.py), for `task_frames` its own
#: (log_reading.py), the frame walk they share with logstore/_cframes.c and that walk's
#: definition (named from this directory)
SOURCES: Final = (
    "_cdecode.c",
    "records.py",
    "claims_span.py",
    "log_reading.py",
    "../logstore/_framewalk.h",
    "../logstore/framing.py",
)
BUILD_ROOT: Final = os.path.join(PACKAGE_DIR, "_compiled_c")

#: why the C decoder is not in use ("" when it is)
reason = "not loaded yet"


def source_key(directory: str = PACKAGE_DIR) -> str:
    return key_of(directory, SOURCES)


def extension_path(key: str) -> str:
    return os.path.join(BUILD_ROOT, key, "_cdecode" + EXT_SUFFIX)


def _find() -> str | None:
    """The build of the current sources (unless QW_PURE is set), or None with `reason` set."""
    global reason
    path, reason = find_build(source_key, extension_path)
    return path


def load() -> ModuleType | None:
    """The C decoder's module when a build of the current sources exists (and QW_PURE is not
    set). records.py loads it at its first decode of claims records, not at its import."""
    path = _find()
    return None if path is None else load_extension(MODULE, path)


def status() -> str:
    if reason == "not loaded yet":
        _find()  # what the first decode will load
    return "C (queue_worker/_cdecode.c)" if not reason else f"Python ({reason})"
