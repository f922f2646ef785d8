"""typer's option coercion for qw's plain option types, without importing pydantic.

typer (0.29) turns each command-line value into its Python type through a pydantic
TypeAdapter, built the first time an option of a command is processed (even one left at
its default). Importing pydantic and building the adapters of one command costs more than
everything else `qw status` does: measured on the 2-core bench machine, `import
typer._adapters` alone is 6.4× a bare `python -c pass`, `import typer` 3.0×; and `qw up`
builds ~20 adapters before its workers can start (see the bench's start section).

qw's options are of four plain kinds: a value read by a `parser=` of ours (cli_options), a
`str`, a `Path`, or a bool flag (typer coerces no bool; a test keeps every option of `up`
and of the small commands plain). For those, `PlainParam` does what the adapter does, and
only when the answer is certain: a parser's return value, the string itself, `Path(text)`
put through typer's own path checks. Anything else (a
failure of any kind, a value of another type) is handed to typer's own coercion, so every
result and every error message is typer's (tests/test_plain_params.py compares the two on
every option of the app). An option of another type keeps typer's coercion untouched.

We keep typer for all it does (parsing, help, errors) and replace only this one step: the
reason is the cost above, measured. It reaches into private names of typer
(`_TyperParameter._runtime_param`, the lazy slot typer fills, and `typer._coercion`): a
typer release that moves them fails this module's import and its test; without the
`install` calls in supervisor/cli.py the commands run as before, only slower.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from typer import _coercion
from typer._click import Command, Context
from typer._param_types import coerce_cli_path, routes_to_path
from typer.core import TyperGroup, _TyperParameter

#: the kinds of option `PlainParam` coerces itself
PARSER: Final = "parser"
STR: Final = "str"
PATH: Final = "path"
BOOL: Final = "bool"  # typer coerces no bool or None itself: anything else goes to typer


@dataclass(frozen=True)
class PlainParam(_coercion.RuntimeParam):
    """One option's coercion: the plain answer, or typer's own whenever it is not certain."""

    kind: str
    descriptor: _coercion.TypeDescriptor

    def _coerce_value(self, value: Any, param: _TyperParameter, ctx: Context) -> Any:
        if self.kind != BOOL:
            try:
                return self._plain(value, param, ctx)
            except Exception:  # typer's coercion below words every error
                pass
        typers = _coercion.build_runtime_param(self.descriptor)
        return typers._coerce_value(value, param=param, ctx=ctx)

    def _plain(self, value: Any, param: _TyperParameter, ctx: Context) -> Any:
        info = self.parameter_info
        if self.kind == PARSER:  # typer: Annotated[Any, BeforeValidator(parser)]
            assert info.parser is not None
            return info.parser(value)
        if self.kind == STR and isinstance(value, str):
            return str(value)
        path_type: Any = info.path_type or self.annotation  # a Path class (plain_kind)
        if self.kind == PATH and isinstance(value, str):
            value = path_type(value)  # what pydantic makes of a str
        if self.kind == PATH and isinstance(value, path_type):
            return coerce_cli_path(value, info, path_type=path_type, param=param, ctx=ctx)
        raise TypeError(value)  # not a case of ours: typer's coercion


def plain_kind(descriptor: _coercion.TypeDescriptor) -> str | None:
    """PARSER, STR, PATH or BOOL for an option `PlainParam` can coerce; None otherwise."""
    info = descriptor.parameter_info
    annotation = descriptor.annotation
    if descriptor.is_file or descriptor.is_list or descriptor.is_tuple:
        return None
    if info.parser is not None:
        return PARSER
    if annotation is str:
        return STR
    if annotation is bool:
        return BOOL
    is_path = isinstance(annotation, type) and issubclass(annotation, Path)
    if is_path and routes_to_path(annotation, info) and info.path_type in (None, annotation):
        return PATH
    return None


def install(command: Command) -> None:
    """Give every plain option of `command` (and of its subcommands) a `PlainParam`."""
    for param in command.params:
        _install_one(param)
    if isinstance(command, TyperGroup):
        for sub in command.commands.values():
            install(sub)


def install_help(ctx: Context) -> None:
    """The same for the --help option of `ctx`'s command, which click makes per context
    (and keeps: this is the object its parser will use). Its value is None unless given,
    and typer builds an adapter even for that."""
    option = ctx.command.get_help_option(ctx)
    if option is not None:
        _install_one(option)


def _install_one(param: object) -> None:
    if not isinstance(param, _TyperParameter) or not hasattr(param, "_runtime_param"):
        return
    descriptor = param.type_descriptor
    kind = plain_kind(descriptor)
    if kind is not None and param._runtime_param is None:
        param._runtime_param = PlainParam(
            parameter_info=descriptor.parameter_info,
            annotation=descriptor.annotation,
            kind=kind,
            descriptor=descriptor,
        )
