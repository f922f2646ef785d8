"""The compiled hot path: the fold's and the worker loop's modules built by mypyc, used only
for their exact sources.

Every worker decodes and folds every claims record, so `queue_worker.records` and
`queue_worker.state` are compiled with mypyc (`python -m queue_worker.build_compiled`, run by
`make`), and so is the worker's loop with what it calls at every task (`COMPILED`). The
Python files stay the one definition of the rules: the extension modules are those same
files compiled, and the Python is what runs whenever they cannot be used.

Why it can never run stale code: a compiled build is not put next to the .py files (where
an editable install would import it and ignore every later edit to the source). It goes to
`queue_worker/_compiled/<key>/`, where `key` is a hash of the compiled modules' sources (and
of the modules they import from this package); the finder below loads an extension only
from the directory named by the hash of the sources as they are *now*. Edit a compiled
module, or one it imports, and the key changes: nothing is found there, the edited Python
runs, and `status()` says so until the build is run again. The key is found once, at the
first import of a compiled module.

Hashing the sources (~350 KiB) costs ~1.7 ms, a good part of a small command's own work, so
it is done once for each state of the files: a build directory keeps a stamp of the sources
it was found to match (`STAMP_FILE`: each file's path, size, mtime, ctime and inode), and a
later process whose sources stat exactly as stamped takes the key from it without reading
them. Any write to a source changes its ctime (which no one can set back, unlike the mtime),
and a file replaced by another changes its inode: the stamp then differs and the sources are
hashed again. A stamp is written only for files whose times are at least `STAMP_MARGIN_NS`
old, so that a write landing in the same tick of a coarse file-system clock as the stamped
state cannot go unseen.

`QW_PURE=1` in the environment forces the Python modules (as does a machine where the build
could not run, for want of a C compiler or of mypy). `status()` says which path is in use.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Sequence
from importlib.machinery import EXTENSION_SUFFIXES, ExtensionFileLoader, ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Final

#: the modules compiled, by their import name (they are compiled together, as one group):
#: the fold, and the worker's per-task loop with what it calls each task (a no-op task's
#: path in a worker is a few hundred Python calls; compiled, ~15-20 % less CPU a task)
COMPILED: Final = (
    "queue_worker.records",
    "queue_worker.state",
    "queue_worker.worker",
    "queue_worker.lease",
    "queue_worker.recorder",
    "queue_worker.publisher",
    "queue_worker.stats",
    "queue_worker.watchdog",
    "queue_worker.handlers",
    "queue_worker.pick",
    "queue_worker.clock",
    "queue_worker.topics",
)
#: the modules (of this package or logstore) the compiled ones import: an edit there must
#: invalidate them too (mypyc compiles against their types)
DEPENDS: Final = (
    "queue_worker.compile_hints",
    "queue_worker.errors",
    "queue_worker.checkpoint",
    "queue_worker.claim_batch",
    "queue_worker.config",
    "queue_worker.inherited",
    "queue_worker.names",
    "queue_worker.percentile",
    "queue_worker.recovery",
    "queue_worker.server_claim",
    "queue_worker.server_verdicts",
    "queue_worker",
    "queue_worker.claims_span",
    "queue_worker.partitions",
    "logstore",
    "logstore.file_log",
    "logstore.file_reads",
    "logstore.location",
    "logstore.redis_log",
)
PURE_ENV: Final = "QW_PURE"
#: in a build directory: the stamp of the sources it was found to match (see the module doc)
STAMP_FILE: Final = "sources.stamp"
#: how old a source's mtime and ctime must be for a stamp of it to be written: more than the
#: tick of any file system's clock (FAT's is 2 s)
STAMP_MARGIN_NS: Final = 3_000_000_000

PACKAGE_DIR: Final = Path(__file__).resolve().parent
BUILD_ROOT: Final = PACKAGE_DIR / "_compiled"
#: the prefix of the mypyc group's shared library module: qwc_<key>__mypyc
GROUP_PREFIX: Final = "qwc_"
EXT_SUFFIX: Final = EXTENSION_SUFFIXES[0]


def source_file(module: str, package_dir: Path = PACKAGE_DIR) -> Path:
    """The file of `module` (of this package, or of logstore beside it)."""
    package, _, rest = module.partition(".")
    directory = package_dir.parent / package
    return directory / (rest.replace(".", "/") + ".py" if rest else "__init__.py")


def source_files() -> list[Path]:
    """The files whose bytes the key covers, in a fixed order."""
    return [source_file(name) for name in (*COMPILED, *DEPENDS)]


def source_key(files: Sequence[Path] | None = None) -> str:
    """The hash of the sources as they are now: 16 hex digits (a valid identifier part)."""
    # blake2b is built in (no OpenSSL to load): this runs at the import of the fold
    from _blake2 import blake2b

    digest = blake2b(digest_size=8)
    for path in files if files is not None else source_files():
        digest.update(f"{path.parent.name}/{path.name}".encode() + b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def source_stamp(files: Sequence[Path]) -> tuple[str, int]:
    """The sources' stamp (a line per file: path, size, mtime, ctime, inode) and the newest
    of their mtimes and ctimes. Raises OSError when one cannot be stat'ed."""
    lines = []
    newest = 0
    for path in files:
        st = os.stat(path)
        lines.append(f"{path}\t{st.st_size}\t{st.st_mtime_ns}\t{st.st_ctime_ns}\t{st.st_ino}\n")
        newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
    return "".join(lines), newest


def stamped_key(stamp: str, root: Path | None = None) -> str | None:
    """The key of the build directory (under `root`) stamped with exactly `stamp`, if any."""
    root = BUILD_ROOT if root is None else root
    try:
        names = os.listdir(root)
    except OSError:
        return None
    for name in names:
        try:
            with open(root / name / STAMP_FILE, encoding="utf-8") as f:
                if f.read() == stamp:
                    return name
        except (OSError, ValueError):  # not a build directory, no stamp, an unreadable one
            continue
    return None


def find_key(
    files: Sequence[Path] | None = None, root: Path | None = None, now_ns: int | None = None
) -> tuple[str, bool]:
    """The key of the sources as they are now, and whether it came from a stamp (else they
    were hashed). After a hash that matches a build under `root`, the build is stamped,
    unless a source is younger than STAMP_MARGIN_NS at `now_ns` (default: now) or changed
    while it was hashed. Raises OSError when a source cannot be read."""
    files = source_files() if files is None else files
    root = BUILD_ROOT if root is None else root
    now_ns = time.time_ns() if now_ns is None else now_ns
    stamp, newest = source_stamp(files)
    key = stamped_key(stamp, root)
    if key is not None:
        return key, True
    key = source_key(files)
    directory = root / key
    if (
        newest <= now_ns - STAMP_MARGIN_NS
        and directory.is_dir()
        and source_stamp(files)[0] == stamp  # not written to while it was hashed
    ):
        _write_stamp(directory, stamp)
    return key, False


def _write_stamp(directory: Path, stamp: str) -> None:
    """Put `stamp` in `directory` whole (a reader sees the old one or the new), or nothing
    where it cannot be written (a read-only install hashes at each start, as before)."""
    temporary = directory / f".{STAMP_FILE}.{os.getpid()}"
    try:
        temporary.write_text(stamp, encoding="utf-8")
        os.replace(temporary, directory / STAMP_FILE)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink()


def group_name(key: str) -> str:
    return f"{GROUP_PREFIX}{key}"


def build_dir(key: str) -> Path:
    return BUILD_ROOT / key


class _Choice:
    """What the finder decided, once per process: the build directory to load from, or why
    the Python modules run."""

    def __init__(self) -> None:
        self.decided = False
        self.directory: Path | None = None
        self.key = ""
        self.stamped = False  # the key came from a build's stamp (the sources not hashed)
        self.reason = "not decided yet (no compiled module imported)"

    def decide(self) -> Path | None:
        if self.decided:
            return self.directory
        self.decided = True
        if os.environ.get(PURE_ENV, "") not in ("", "0"):
            self.reason = f"{PURE_ENV}={os.environ[PURE_ENV]}"
            return None
        try:
            self.key, self.stamped = find_key()
        except OSError as e:  # a source missing (an install without them): nothing to match
            self.reason = f"cannot read the sources to hash: {e}"
            return None
        directory = build_dir(self.key)
        missing = [name for name in COMPILED if not _extension(directory, name).is_file()]
        if missing:
            built = BUILD_ROOT.is_dir() and any(BUILD_ROOT.iterdir())
            self.reason = (
                "the compiled build is of other sources (edited since): rebuild with "
                "`make compiled`"
                if built
                else "not built (`make compiled`; it needs mypy and a C compiler)"
            )
            return None
        self.directory = directory
        self.reason = ""
        return directory


def _extension(directory: Path, module: str) -> Path:
    return directory / (module.rsplit(".", 1)[-1] + EXT_SUFFIX)


_choice = _Choice()


class CompiledFinder:
    """A meta path finder for the compiled modules and their group's shared library: it
    answers only from the build directory of the current sources' key (else the normal
    finders load the .py)."""

    @staticmethod
    def find_spec(
        fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname in COMPILED:
            directory = _choice.decide()
            if directory is None:
                return None
            file = _extension(directory, fullname)
        elif fullname.startswith(GROUP_PREFIX) and fullname.endswith("__mypyc"):
            directory = _choice.decide()
            if directory is None or fullname != group_name(_choice.key) + "__mypyc":
                return None
            file = directory / (fullname + EXT_SUFFIX)
        else:
            return None
        if not file.is_file():
            return None
        return ModuleSpec(fullname, ExtensionFileLoader(fullname, str(file)), origin=str(file))


def install() -> None:
    """Put the finder first on sys.meta_path (once); cheap: nothing is hashed until a
    compiled module is imported."""
    if not any(finder is CompiledFinder for finder in sys.meta_path):
        sys.meta_path.insert(0, CompiledFinder)


def in_use() -> list[str]:
    """The compiled modules imported so far that run compiled."""
    return [
        name
        for name in COMPILED
        if (module := sys.modules.get(name)) is not None
        and str(getattr(module, "__file__", "")).endswith(EXT_SUFFIX)
    ]


def status() -> str:
    """One line: which path the fold runs (for a bench line, `qw --version`, /stats), which
    frame-decoding loop the log reads with (logstore.native), and which claims decoder
    (queue_worker.cdecode)."""
    from logstore.framing import frames_loop_status  # only asked for now and then
    from queue_worker import cdecode

    compiled = in_use()
    if compiled:
        fold = f"compiled (mypyc, sources {_choice.key}): {', '.join(compiled)}"
    else:
        fold = f"pure Python ({_choice.reason})"
    return f"{fold}; frames: {frames_loop_status()}; claims decoder: {cdecode.status()}"
