"""What mypyc is told about a compiled class, importable where mypy is not installed.

`mypyc_attr` is mypy_extensions' (mypy resolves it there, and mypyc reads it when it
compiles a module: see `queue_worker.compiled`); at run time without the compiled build it
is a decorator that changes nothing. This module is not compiled: a compiled module cannot
hold the run-time fallback (mypyc compiles the branch mypy calls unreachable into an error).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mypy_extensions import mypyc_attr
else:  # mypy_extensions ships with mypy, which is no dependency of qw

    def mypyc_attr(*_args: object, **_flags: object):
        return lambda cls: cls


__all__ = ["mypyc_attr"]
