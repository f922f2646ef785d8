"""The Lua scripts qw runs on Redis: ``.lua`` files in the ``lua/`` folder beside the module
that runs them, shipped as package data (pyproject.toml) and read with importlib.resources.

A script is the files it is made of, read one after the other (`lua_source`): first the
files that define the shared local functions it calls (``queue_refused.lua``,
``trimmed_before.lua``, ... each defines one, and says what it takes), then its own body.
Redis runs the text as one chunk, so a body sees every function defined before it. Each
module registers its scripts with redis-py (``register_script``: EVALSHA, loaded on
NOSCRIPT), once.
"""

from __future__ import annotations

from importlib import resources
from typing import Final

#: the folder of a package that holds its scripts
FOLDER: Final = "lua"

#: every file read so far, as (package, file name): tests/test_lua_files.py checks that
#: each is package data
READ: set[tuple[str, str]] = set()


def lua_file(package: str, name: str) -> str:
    """The text of the script file `name` in `package`'s ``lua/`` folder."""
    READ.add((package, name))
    return resources.files(package).joinpath(FOLDER).joinpath(name).read_text(encoding="utf-8")


def lua_source(package: str, *names: str) -> str:
    """The files `names` of `package`'s ``lua/`` folder, one after the other: a script made
    of its shared functions' files and its own (module docstring)."""
    return "".join(lua_file(package, name) for name in names)


__all__ = ["FOLDER", "READ", "lua_file", "lua_source"]
