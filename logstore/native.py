"""The frame-decoding loop in C (`logstore/_cframes.c`), used only for its exact sources.

`framing._decode_loop` is the loop's one definition; the C file does the same walk over the
frame headers and checksums, with no rule of the protocol in it. It is built by
`python -m queue_worker.build_compiled` (which `make` runs) into
`logstore/_compiled/<key>/`, where `key` hashes the C file and framing.py: an edit to either
means no build of that key exists, and the Python loop runs (as with `QW_PURE=1`, or on a
machine where the build could not run). Never next to the sources, where an editable
install would load a stale build.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from importlib.machinery import EXTENSION_SUFFIXES, ExtensionFileLoader
from importlib.util import module_from_spec, spec_from_loader
from types import ModuleType
from typing import Any, Final

from logstore.base import Entry

#: (starts, datas, pos, batch_start, ready), as framing._decode_loop returns them
LoopResult = tuple[list[int], list[bytes], int, int, int]
Loop = Callable[[bytes, int, int, int], LoopResult]
#: (entries, pos, batch_start, ready), as framing._decode_entries returns them
EntriesResult = tuple[list[Entry], int, int, int]
EntriesLoop = Callable[[bytes, int, int, int, int, type[Entry]], EntriesResult]
#: (items, positions, pos, batch_start, ready): a span loop (framing.decode_span)
SpanResult = tuple[list[Any], list[int], int, int, int]
SpanLoop = Callable[[bytes, int, int, int, int], SpanResult]
#: (end, open_batch, last_batch), as framing._walk_frames returns them
WalkLoop = Callable[
    [bytes | bytearray | memoryview, int, int, int, int, bool], tuple[int, int, int]
]
#: (frames, lengths) or None, as file_log._frame_batch_py answers (None: where it raises)
FrameBatch = Callable[[Sequence[bytes], int], "tuple[bytes, list[int]] | None"]

MODULE: Final = "logstore._cframes"
PURE_ENV: Final = "QW_PURE"
PACKAGE_DIR: Final = os.path.dirname(os.path.abspath(__file__))
SOURCES: Final = ("_cframes.c", "_framewalk.h", "framing.py")
BUILD_ROOT: Final = os.path.join(PACKAGE_DIR, "_compiled")
EXT_SUFFIX: Final = EXTENSION_SUFFIXES[0]

#: why the C loop is not in use ("" when it is)
reason = "not loaded yet"


def key_of(directory: str, sources: Sequence[str]) -> str:
    """The hash of the files `sources` (names in `directory`) as they are now: 16 hex digits.
    Also the key of queue_worker's C decoder (queue_worker.cdecode)."""
    from _blake2 import blake2b  # built in, cheap to import (hashlib loads OpenSSL)

    digest = blake2b(digest_size=8)
    for name in sources:
        with open(os.path.join(directory, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read() + b"\0")
    return digest.hexdigest()


def source_key(directory: str = PACKAGE_DIR) -> str:
    return key_of(directory, SOURCES)


def load_extension(module: str, path: str) -> ModuleType:
    """The extension module `module` from the file `path` (not put in sys.modules)."""
    spec = spec_from_loader(module, ExtensionFileLoader(module, path), origin=path)
    assert spec is not None
    loaded = module_from_spec(spec)
    spec.loader.exec_module(loaded)  # type: ignore[union-attr]
    return loaded


def extension_path(key: str) -> str:
    return os.path.join(BUILD_ROOT, key, "_cframes" + EXT_SUFFIX)


def find_build(
    source_key: Callable[[], str], extension_path: Callable[[str], str]
) -> tuple[str | None, str]:
    """(the path of the build of the sources as they are now, "") when one exists and
    QW_PURE is not set; else (None, why not). Also queue_worker.cdecode's."""
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return None, f"{PURE_ENV}={os.environ[PURE_ENV]}"
    try:
        path = extension_path(source_key())
    except OSError as e:  # an install without the C source: nothing to match
        return None, f"cannot read the sources to hash: {e}"
    if not os.path.isfile(path):
        return None, "no build of these sources (`make compiled`)"
    return path, ""


def load() -> tuple[Loop, EntriesLoop, WalkLoop, FrameBatch] | None:
    """The C loops (`decode_loop`, `decode_entries`, `walk_frames`) and the batch framing
    (`frame_batch`) when a build of the current sources exists (and QW_PURE is not set)."""
    global reason
    path, reason = find_build(source_key, extension_path)
    if path is None:
        return None
    module = load_extension(MODULE, path)
    loop: Loop = module.decode_loop
    entries: EntriesLoop = module.decode_entries
    walk: WalkLoop = module.walk_frames
    batch: FrameBatch = module.frame_batch
    return loop, entries, walk, batch


def status(loop: object) -> str:
    return "C (logstore/_cframes.c)" if loop is not None else f"Python ({reason})"
