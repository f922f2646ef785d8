"""Build the compiled fold and worker loop, and the C parts: python -m queue_worker.build_compiled

The fold's and the worker loop's modules are compiled by mypyc (see `queue_worker.compiled`);
the frame-decoding loop is `logstore/_cframes.c` (see `logstore.native`) and the claims
records' decoder `queue_worker/_cdecode.c` (see `queue_worker.cdecode`). Each build lands in
a directory named by the hash of its sources, which is the only place its loader looks.

`make up`, `make test` and CI run it. It copies the sources to a scratch directory first and
takes the key from the copies, so that an edit made while it builds cannot end up under the
key of the sources it did not build. Without mypy or a C compiler it says why on one line
and exits 0: the Python modules run (`QW_REQUIRE_COMPILED=1`, as CI sets it, makes that an
error instead, exit 1).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from logstore import native
from queue_worker import cdecode
from queue_worker.compiled import (
    BUILD_ROOT,
    COMPILED,
    DEPENDS,
    EXT_SUFFIX,
    PACKAGE_DIR,
    build_dir,
    group_name,
    source_files,
    source_key,
)

REQUIRE_ENV = "QW_REQUIRE_COMPILED"

#: what mypyc compiles with: the project's strict settings (as in pyproject.toml)
MYPY_INI = """\
[mypy]
python_version = 3.10
strict = True
[mypy-msgpack.*]
ignore_missing_imports = True
"""


class BuildError(Exception):
    """Why the compiled path could not be built (one line)."""


def build(verbose: bool = False) -> Path:
    """Build the compiled modules for the sources as they are now; return their directory
    (at once when it is already built). Raises BuildError."""
    with tempfile.TemporaryDirectory(prefix="qw-compile-") as tmp:
        root = Path(tmp)
        # Both packages whole: mypyc type-checks the compiled modules against all they
        # import (the worker imports much of the package); the key covers only the files
        # it names (compiled.source_files).
        for package in ("queue_worker", "logstore"):
            here = PACKAGE_DIR.parent / package
            (root / "src" / package).mkdir(parents=True)
            for path in [*here.glob("*.py"), here / "py.typed"]:
                shutil.copyfile(path, root / "src" / package / path.name)
        copies = [root / "src" / path.parent.name / path.name for path in source_files()]
        key = source_key(copies)
        target = build_dir(key)
        if target.is_dir():
            return target
        built = _compile(root, key, [c for c in copies if _module(c) in COMPILED], verbose)
        _install(built, BUILD_ROOT, target)
    _forget_others(BUILD_ROOT, target)
    return target


def _forget_others(root: Path, target: Path) -> None:
    for old in root.iterdir():  # builds of other sources can never be loaded again
        if old != target:
            shutil.rmtree(old, ignore_errors=True)


def _install(built: list[Path], root: Path, target: Path) -> None:
    """Copy `built` into `target` (under `root`) all at once: a reader never sees half."""
    root.mkdir(exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    for file in built:
        shutil.copy2(file, staging / file.name)
    try:
        staging.rename(target)
    except OSError:  # another build of the same sources got there first
        shutil.rmtree(staging, ignore_errors=True)


def build_frames(verbose: bool = False) -> Path:
    """Build logstore/_cframes.c for the sources as they are now; return the extension file
    (at once when it is already built). Raises BuildError."""
    return _build_c(
        native.MODULE,
        native.PACKAGE_DIR,
        native.SOURCES,
        native.source_key,
        native.extension_path,
        native.BUILD_ROOT,
        ["z"],
        verbose,
    )


def build_decoder(verbose: bool = False) -> Path:
    """Build queue_worker/_cdecode.c (the claims records' C decoder) for the sources as they
    are now; return the extension file (at once when it is already built). Raises BuildError."""
    return _build_c(
        cdecode.MODULE,
        cdecode.PACKAGE_DIR,
        cdecode.SOURCES,
        cdecode.source_key,
        cdecode.extension_path,
        cdecode.BUILD_ROOT,
        ["z"],  # the frame walk's crc32 (decode_claims_frames)
        verbose,
    )


def _build_c(
    module: str,
    package_dir: str,
    sources: tuple[str, ...],
    key_of: Callable[[str], str],
    extension_path: Callable[[str], str],
    build_root: str,
    libraries: list[str],
    verbose: bool,
) -> Path:
    """Build the C extension `module` (its C file first in `sources`) from copies of the
    sources, into the directory of their key under `build_root`."""
    with tempfile.TemporaryDirectory(prefix="qw-c-") as tmp:
        root = Path(tmp)
        # the package's files in `src`, a source named from its directory ("../logstore/…")
        # beside it, where the C file's #include finds it too
        src = root / "src"
        for name in sources:
            copy = Path(os.path.normpath(src / name))
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(package_dir) / name, copy)
        target = Path(extension_path(key_of(str(src))))
        if target.is_file():
            return target
        try:
            extension = importlib.import_module("setuptools").Extension
            distribution = importlib.import_module("setuptools").Distribution
        except ImportError as e:
            raise BuildError(f"setuptools is not installed ({e.name})") from None
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(sys.stdout if verbose else out):
                ext = extension(
                    module,
                    [str(src / sources[0])],
                    libraries=libraries,
                    extra_compile_args=["-O2"],
                )
                dist = distribution({"name": f"qw-{module}", "ext_modules": [ext]})
                command = dist.get_command_obj("build_ext")
                command.build_lib = str(root / "lib")
                command.build_temp = str(root / "tmp")
                command.ensure_finalized()
                command.run()
        except SystemExit as e:
            raise BuildError(f"the C build failed: {e}; {_last_line(out.getvalue())}") from None
        except Exception as e:  # a missing compiler or header surfaces in several types
            raise BuildError(f"the C build failed: {type(e).__name__}: {e}") from None
        built = sorted((root / "lib").rglob(f"*{EXT_SUFFIX}"))
        if [f.name for f in built] != [target.name]:
            raise BuildError(f"the C build made {[f.name for f in built]}, not {target.name}")
        _install(built, Path(build_root), target.parent)
    _forget_others(Path(build_root), target.parent)
    return target


def _module(path: Path) -> str:
    return f"queue_worker.{path.stem}"


def _compile(root: Path, key: str, paths: list[Path], verbose: bool) -> list[Path]:
    """mypyc the `paths` (copies under root/src) as one group; the extension files built."""
    try:
        from mypyc.build import mypycify

        # typed in some setuptools versions, not in others: used untyped
        distribution = importlib.import_module("setuptools").Distribution
    except ImportError as e:
        raise BuildError(f"mypyc or setuptools is not installed ({e.name})") from None
    ini = root / "mypy.ini"
    ini.write_text(MYPY_INI)
    lib = root / "lib"
    out = io.StringIO()
    cwd = os.getcwd()
    os.chdir(root / "src")  # mypy finds the copied package from here, not the installed one
    try:
        with contextlib.redirect_stdout(sys.stdout if verbose else out):
            extensions = mypycify(
                ["--config-file", str(ini), *(str(p.relative_to(root / "src")) for p in paths)],
                group_name=group_name(key),
                target_dir=str(root / "c"),
            )
            dist = distribution({"name": "qw-compiled", "ext_modules": extensions})
            command = dist.get_command_obj("build_ext")
            command.build_lib = str(lib)
            command.build_temp = str(root / "tmp")
            command.ensure_finalized()
            command.run()
    except SystemExit as e:  # mypy's type errors and setuptools' compile errors exit
        raise BuildError(f"the build failed: {e}; {_last_line(out.getvalue())}") from None
    except Exception as e:  # a missing compiler surfaces as one of several error types
        raise BuildError(f"the build failed: {type(e).__name__}: {e}") from None
    finally:
        os.chdir(cwd)
    built = sorted(lib.rglob(f"*{EXT_SUFFIX}"))
    wanted = {p.stem + EXT_SUFFIX for p in paths} | {f"{group_name(key)}__mypyc{EXT_SUFFIX}"}
    if {f.name for f in built} != wanted:
        raise BuildError(f"the build made {[f.name for f in built]}, expected {sorted(wanted)}")
    return built


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="show mypyc and the compiler")
    args = parser.parse_args(argv)
    required = os.environ.get(REQUIRE_ENV, "") not in ("", "0")
    failed = False
    for names, how, builder in (
        (", ".join(COMPILED), "mypyc", build),
        ("the frame loop (logstore/_cframes.c)", "C", build_frames),
        ("the claims decoder (queue_worker/_cdecode.c)", "C", build_decoder),
    ):
        try:
            target = builder(args.verbose)
        except BuildError as e:
            failed = True
            print(
                f"qw: {names} not compiled: {e}; "
                + (f"{REQUIRE_ENV} is set" if required else "the Python runs instead"),
                file=sys.stderr,
            )
        else:
            print(f"qw: {names} compiled ({how}): {target}")
    return 1 if failed and required else 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["DEPENDS", "BuildError", "build", "main"]
