"""Write supervisor/fast_spec.py: the small commands' options, read from the typer app.

    python -m supervisor.make_fast_spec          (`make compiled` runs it too)

The fast path (supervisor.fast_path) parses the plain forms of `qw status`, `qw task`,
`qw why` and `qw enqueue` without importing typer; what it knows of their options is this
spec, generated from the very click commands typer builds, so the command line has one
definition. tests/test_fast_path.py regenerates it and fails when the file differs.

A command goes into the spec only if every one of its parameters is of a kind the fast path
coerces exactly as typer does (supervisor.plain_params' kinds, one value each, a path with
typer's default checks); otherwise this script stops and says which parameter.
"""

from __future__ import annotations

import inspect
import pprint
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from supervisor import option_parsers, small_commands

#: the commands the fast path runs, and the body each one's typer command calls
BODIES: Final[dict[str, Callable[..., None]]] = {
    "status": small_commands.status,
    "task": small_commands.task,
    "why": small_commands.why,
    "enqueue": small_commands.enqueue,
}
SPEC_PATH: Final = Path(__file__).with_name("fast_spec.py")

#: typer's checks of a path option when none is asked for (ParameterInfo's defaults)
PLAIN_PATH: Final = {
    "exists": False,
    "file_okay": True,
    "dir_okay": True,
    "writable": False,
    "readable": True,
    "resolve_path": False,
    "allow_dash": False,
}

HEADER: Final = '''"""The small commands' options, as typer builds them (generated: do not edit).

Written by `python -m supervisor.make_fast_spec` from the typer app; read by
supervisor.fast_path. tests/test_fast_path.py fails when this file is not what the script
writes today.
"""

from typing import Any

# fmt: off
'''


class SpecError(Exception):
    """A parameter the fast path could not take exactly as typer does."""


def spec() -> dict[str, Any]:
    """Every fast command: its body and its parameters, in the order typer declares them."""
    from typer.main import get_command

    from supervisor.cli import app
    from supervisor.plain_params import BOOL, PATH, plain_kind

    group: Any = get_command(app)
    commands: dict[str, Any] = {}
    for name, body in BODIES.items():
        command = group.commands[name]
        if command.no_args_is_help or command.context_settings:
            raise SpecError(f"qw {name}: context settings the fast path does not follow")
        params = []
        for param in command.params:
            where = f"qw {name}: {param.name}"
            descriptor = param.type_descriptor
            kind = plain_kind(descriptor)
            if kind is None or param.nargs != 1 or param.multiple or param.callback:
                raise SpecError(f"{where}: not a plain parameter (supervisor.plain_params)")
            info = descriptor.parameter_info
            if kind == PATH and any(getattr(info, k) != v for k, v in PLAIN_PATH.items()):
                raise SpecError(f"{where}: a path with checks of its own")
            is_option = param.param_type_name == "option"
            is_flag = bool(is_option and param.is_flag)
            if is_flag != (kind == BOOL) or (is_option and (param.prompt or param.count)):
                raise SpecError(f"{where}: prompts, counts, or a flag that is not a bool")
            default = param.default
            if isinstance(default, Path):
                default = str(default)  # a path's default is given as its text
            params.append(
                {
                    "name": param.name,
                    "kind": kind,
                    "parser": _parser_name(info.parser, where),
                    "option": is_option,
                    "opts": [o for o in param.opts if o.startswith("--")] if is_option else [],
                    "flag": is_flag,
                    "off": [o for o in param.secondary_opts if o.startswith("--")]
                    if is_option
                    else [],
                    "required": bool(param.required),
                    "default": default,
                    "envvar": _envvars(param),
                }
            )
        names = [p["name"] for p in params]
        if names != list(inspect.signature(body).parameters):
            raise SpecError(f"qw {name}: the body's parameters are not {names}")
        commands[name] = {"body": f"{body.__module__}:{body.__name__}", "params": params}
    return commands


def _parser_name(parser: object, where: str) -> str | None:
    if parser is None:
        return None
    for attr, value in vars(option_parsers).items():
        if value is parser:
            return f"{option_parsers.__name__}:{attr}"
    raise SpecError(f"{where}: its parser is not named in {option_parsers.__name__}")


def _envvars(param: Any) -> list[str]:
    envvar = param.envvar
    if envvar is None:
        return []
    return [envvar] if isinstance(envvar, str) else list(envvar)


def text() -> str:
    """The module as this script writes it."""
    body = pprint.pformat(spec(), indent=1, width=100, sort_dicts=False)
    return f"{HEADER}COMMANDS: dict[str, Any] = {body}\n"


def main() -> int:
    SPEC_PATH.write_text(text(), encoding="utf-8")
    print(f"wrote {SPEC_PATH}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
