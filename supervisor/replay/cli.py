"""The `qw replay` command: read the run, then play it in the terminal or print one screen."""

from __future__ import annotations

from typing import Annotated, Final

import typer

from supervisor.options import (
    DEFAULT_DIR,
    MAX_POSITION,
    DirOption,
    LogOption,
    fail,
    location_of,
    one_of,
    whole,
)

# The tape, the fold and rich are imported when `qw replay` runs, not by every `qw`.

#: the rules `--rules` takes: qw's (supervisor.replay.rules.RULES; a test checks they
#: agree), or qw's with the original's unfenced rules beside them
RULE_NAMES: Final = ("qw", "unfenced")


def register(app: typer.Typer) -> None:
    """Add `replay` to the `qw` app."""
    app.command(
        epilog="Examples:  qw replay  ·  qw replay --at 4096  ·  "
        "qw replay --no-tui --at 4096 > screen.txt"
    )(replay)


def replay(
    directory: DirOption = DEFAULT_DIR,
    log: LogOption = None,
    at: Annotated[
        int | None,
        typer.Option(
            "--at",
            parser=whole("a log position", 0, MAX_POSITION),
            metavar="POSITION",
            help="Start at the last claims record at or before this position (as qw "
            "report --at replays). Default: the start (with --no-tui: the end).",
        ),
    ] = None,
    partition: Annotated[
        int | None,
        typer.Option(
            "--partition",
            parser=whole("a partition number", 0, 1023),
            metavar="K",
            help="On a partitioned queue: replay partition K (each has its own tape).",
        ),
    ] = None,
    rules: Annotated[
        str,
        typer.Option(
            "--rules",
            parser=one_of(*RULE_NAMES),
            metavar="|".join(RULE_NAMES),
            help="The rules the records are judged by: qw's, or qw's with the original's "
            "unfenced rules beside them (each record they judge differently is an event).",
        ),
    ] = "qw",
    no_tui: Annotated[
        bool, typer.Option("--no-tui", help="Print the screen at --at as text and exit.")
    ] = False,
) -> None:
    """Step through a recorded run, forwards and back: the claims log is the tape.

    Each step applies one record through the fold and shows its verdict in qw why's words,
    the tasks held, each worker's lane and the counters so far: at any position, what
    qw report --at POSITION replays. Keys: → ← step, ] [ next/previous event, space play,
    + - speed, g go to, / follow a task or worker, ? keys, q quit.
    """
    import os
    import sys

    from logstore.location import shown
    from queue_worker.proof.log_reading import ReportInputError
    from supervisor.replay.model import Stepper
    from supervisor.replay.rules import RULES
    from supervisor.replay.tape import load_tape, partition_of

    location = location_of(directory, log)
    try:
        tape_location = partition_of(location, partition)
        tape = load_tape(tape_location, None if tape_location == location else location)
    except ReportInputError as e:
        fail(str(e))
    stepper = Stepper(tape, RULES["qw"], beside=rules == "unfenced")
    if at is not None:
        stepper.go_position(at)
    elif not no_tui:
        stepper.seek(-1)
    name = shown(tape_location)
    if no_tui or not sys.stdout.isatty():
        from supervisor.replay.view import Lanes, plain_screen
        from supervisor.story_text import plain_width

        lines = os.environ.get("LINES", "")
        height = int(lines) if lines.isdigit() and int(lines) >= 10 else 24
        typer.echo(plain_screen(stepper.moment(), Lanes(stepper), plain_width(), height, name))
        return
    from supervisor.replay.player import Player, run_player

    try:
        run_player(Player(stepper, name))
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


__all__ = ["register"]
