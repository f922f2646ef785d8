"""The plain forms of `qw status`, `task`, `why` and `enqueue`, run without importing typer.

`import typer` alone costs ~3× a bare `python -c pass`; these commands do little else. For
them the `qw` script (supervisor.entry) first asks `run`: it parses the command line from
supervisor.fast_spec (generated from the typer app by supervisor.make_fast_spec, so the
options have one definition) and calls the command's body (supervisor.small_commands)
with the values typer would pass. It takes only the plain forms:

- the command's name, first;
- its long options as `--name VALUE` or `--name=VALUE` (a value neither empty nor
  starting with '-'), each at most once; its flags as `--flag`;
- exactly its positional arguments.

Anything else — `--help`, a short or abbreviated option, an unknown one, `--`, a value
its parser refuses or that typer's checks could word differently, an environment variable
one of its options reads (QW_LOG) — returns None, and the typer path parses the same
command line and answers, errors and all. Values are coerced as supervisor.plain_params
coerces them under typer: the option's own parser, the text itself, or a Path with
typer's default checks. Once the body runs, its outcome is handled as typer's main and
supervisor.cli.main handle it (tests/test_fast_path.py compares the two paths).
"""

from __future__ import annotations

import errno
import os
import sys
from importlib import import_module
from pathlib import Path
from typing import Any

from supervisor.fast_spec import COMMANDS


class NotPlain(Exception):
    """The command line is not a plain form: the typer path answers it."""


def run(args: list[str]) -> int | None:
    """The exit code of the command line `args` (without the program name), run without
    typer; None when it is not a plain form of a fast command (nothing has run then)."""
    command = COMMANDS.get(args[0]) if args else None
    if command is None:
        return None
    params: list[dict[str, Any]] = command["params"]
    if any(env in os.environ for p in params for env in p["envvar"]):
        return None  # typer reads the variable (and words its errors)
    try:
        given = parse(params, args[1:])
        values = {p["name"]: coerce(p, given.get(p["name"], p["default"])) for p in params}
    except NotPlain:
        return None
    except Exception:  # a parser or a check refused a value: typer words the error
        return None
    module, _, name = str(command["body"]).partition(":")
    body = getattr(import_module(module), name)
    return call(body, values)


def parse(params: list[dict[str, Any]], args: list[str]) -> dict[str, Any]:
    """Each given parameter's value as text (True/False for a flag); NotPlain otherwise."""
    by_opt: dict[str, dict[str, Any]] = {}
    for p in params:
        for opt in p["opts"] + p["off"]:
            by_opt[opt] = p
    positional = [p for p in params if not p["option"]]
    given: dict[str, Any] = {}
    rest = iter(args)
    for arg in rest:
        if not arg.startswith("-"):
            if not positional:
                raise NotPlain(arg)  # an extra argument
            given[positional.pop(0)["name"]] = arg
            continue
        opt, eq, value = arg.partition("=")
        option = by_opt.get(opt)
        if option is None or option["name"] in given:
            raise NotPlain(arg)  # unknown, short, abbreviated, `--`, or given twice
        if option["flag"]:
            if eq:
                raise NotPlain(arg)  # a flag takes no value
            given[option["name"]] = opt in option["opts"]
            continue
        if not eq:
            value = next(rest, "")
        if not value or value.startswith("-"):
            raise NotPlain(arg)
        given[option["name"]] = value
    if any(p["required"] for p in positional):
        raise NotPlain("a missing argument")
    return given


def coerce(param: dict[str, Any], value: Any) -> Any:
    """What typer hands the body for `value` (given or the default), as plain_params
    coerces it; an exception, or NotPlain, where typer might answer otherwise."""
    kind = param["kind"]
    if value is None or kind == "bool":
        return value  # typer coerces neither None nor a flag's bool
    if kind == "parser":
        module, _, name = param["parser"].partition(":")
        return getattr(import_module(module), name)(value)
    if kind == "str":
        return value
    if kind == "path":  # typer's checks with their defaults: only "is not readable" can fail
        path = Path(value)
        try:
            os.stat(path)
        except OSError:
            return path  # need not exist
        if not os.access(path, os.R_OK):
            raise NotPlain(value)  # typer's error
        return path
    raise NotPlain(kind)


def call(body: Any, values: dict[str, Any]) -> int:
    """Run `body` and end as typer's main and supervisor.cli.main end for its outcome."""
    try:
        result = body(**values)
    except KeyboardInterrupt:
        return 130  # typer: Exit(130)
    except EOFError:
        sys.stderr.write("\n")  # click's Abort: a new line on stderr, then qw's 130
        sys.stderr.flush()
        return 130
    except OSError as e:
        if e.errno != errno.EPIPE:
            raise
        from typer._click.utils import PacifyFlushWrapper

        sys.stdout = PacifyFlushWrapper(sys.stdout)
        sys.stderr = PacifyFlushWrapper(sys.stderr)
        sys.exit(1)
    except Exception as e:
        typer = sys.modules.get("typer")  # a body raises typer's exceptions through lazy_typer
        if typer is None:
            raise
        if isinstance(e, typer.Exit):
            return int(e.exit_code)
        if isinstance(e, typer.Abort):
            return 130
        if isinstance(e, typer.TyperException):
            from supervisor.lazy_typer import said

            return said(e)
        raise
    return result if isinstance(result, int) else 0
