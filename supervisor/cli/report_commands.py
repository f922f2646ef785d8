"""The `qw report`, `qw why` and `qw demo …` commands (registered on the main app).

The command bodies only read the logs, print, and exit with the report's code; the text is
built by supervisor.report_text (pure builders the demos use too). On a terminal the tables
are drawn and coloured; piped, they are plain aligned columns.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from logstore.location import is_redis_url, shown
from supervisor.cli import option_parsers, small_commands
from supervisor.cli import partitioned_commands as partitioned_cli
from supervisor.demos import demo_app
from supervisor.options import MAX_POSITION, DirOption, LogOption, one_of, whole

if TYPE_CHECKING:
    from queue_worker.proof.unfenced import Comparison

# What a command reads and prints with (the report, the rich tables) is imported when it
# runs: `qw --help` and the other commands do not pay for it.

DEFAULT_DIR: Final = Path(".qw")
#: `qw report`: the server's verdicts (Redis) disagree with the fold
# (queue_worker.proof.verdict_check)
EXIT_VERDICTS_DISAGREE: Final = 3
#: `qw report`: a log lost records that nothing accounts for (logstore.LostHistoryError)
EXIT_LOST_HISTORY: Final = 3

JsonOption = Annotated[bool, typer.Option("--json", help="One JSON object on stdout.")]
#: `--rules`: the choices (supervisor.unfenced_text.RULES, named here so that `qw --help`
#: does not import it)
RULES: Final = ("qw", "unfenced")
RulesOption = Annotated[
    str,
    typer.Option(
        "--rules",
        parser=one_of(*RULES),
        metavar="qw|unfenced",
        help="unfenced: also judge the log by the original's rules (no fencing, owners are "
        "names, no renewal) and name every record judged differently.",
    ),
]


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `qw` app."""
    app.command("report")(report_command)
    app.command("why")(why_command)
    app.add_typer(demo_app, name="demo")


# -- the commands ----------------------------------------------------------------------------


def report_command(
    directory: DirOption = DEFAULT_DIR,
    log: LogOption = None,
    as_json: JsonOption = False,
    at: Annotated[
        int | None,
        typer.Option(
            "--at",
            parser=whole("a log position", 0, MAX_POSITION),
            metavar="POSITION",
            help="Replay the claims log only up to the record at this position (inclusive).",
        ),
    ] = None,
    timeline: Annotated[
        Path | None,
        typer.Option(
            "--timeline",
            metavar="FILE",
            help="Also write the run's picture (as `qw timeline --out FILE`).",
        ),
    ] = None,
    rules: RulesOption = "qw",
) -> None:
    """Replay both logs from the beginning and prove that no task was worked twice.

    Exit 0: every finished task was completed exactly once and none was worked twice.

    Exit 1: a task was worked twice (each is named with the positions of its records).

    Exit 2: no logs there, or a damaged log (the message names the file and byte offset).

    Exit 3: on Redis with server verdicts, the server's per-task state disagrees with the
    fold of the claims log (a bug: each task is named on stderr); or a stream lost
    entries that nothing accounts for (trimmed by hand: the history is lost).
    """
    from logstore import LostHistoryError
    from queue_worker.proof.report import ReportInputError, load_report
    from supervisor.console import stdout_console
    from supervisor.report_text import render_report

    location = small_commands.report_location(directory, log)
    if rules != "qw":
        partitioned_cli.refuse_rules(location, rules)
    if at is None:
        code = partitioned_cli.report(location, as_json, timeline)
        if code is not None:  # a partitioned queue: every partition, and the whole
            if _server_verdicts_disagree(location, partitioned=True):
                raise typer.Exit(EXIT_VERDICTS_DISAGREE)
            raise typer.Exit(code)
    else:
        partitioned_cli.refuse_at(location)
    try:
        report = load_report(location, up_to=at)
    except ReportInputError as e:
        lost = isinstance(e.__cause__, LostHistoryError)
        raise small_commands.report_fail(str(e), EXIT_LOST_HISTORY if lost else None) from None
    if timeline is not None:
        _write_timeline(location, timeline, unfenced=rules == "unfenced")
    disagreements = _server_verdicts_disagree(location) if at is None else []
    if as_json:
        body = report.to_json()
        body["verdict_disagreements"] = disagreements
        # by this machine's clock, for the reader (the report itself is a pure replay)
        now_us = time.time_ns() // 1000
        body["held_expired"] = [h.task for h in report.held if h.lease.expiry <= now_us]
        if rules == "unfenced":
            body["rules"] = "unfenced"
            body["unfenced"] = _unfenced_json(location, at)
        typer.echo(json.dumps(body, indent=2))
    else:
        console = stdout_console()
        console.print(render_report(report, shown(location), plain=not console.is_terminal))
        if rules == "unfenced":
            typer.echo("")
            for line in _unfenced_lines(location, at):
                typer.echo(line)
    if disagreements:
        raise typer.Exit(EXIT_VERDICTS_DISAGREE)
    raise typer.Exit(report.exit_code)


def _server_verdicts_disagree(location: str, *, partitioned: bool = False) -> list[str]:
    """On Redis with server verdicts: where they disagree with the fold (a bug, said loudly
    on stderr whatever the output format; see queue_worker.proof.verdict_check), in every
    partition of a partitioned queue."""
    if not is_redis_url(location):
        return []
    from queue_worker.proof.verdict_check import check_location

    if partitioned:
        from queue_worker.partition_layout import partition_location

        manifest = partitioned_cli.manifest_at(location, create=False)
        count = manifest.count if manifest is not None else 0
        disagreements = [
            f"partition {k}: {line}"
            for k in range(count)
            for line in check_location(partition_location(location, k, count))
        ]
    else:
        disagreements = check_location(location)
    if disagreements:
        typer.echo(
            "qw: BUG: the server's verdicts disagree with the fold of the claims log "
            "(the fold is the definition; please report this):",
            err=True,
        )
        for line in disagreements:
            typer.echo(f"qw: BUG: {line}", err=True)
    return disagreements


def _comparison(location: str, at: int | None) -> Comparison:
    """The log judged under both rule sets (queue_worker.proof.unfenced), as far as `at`."""
    from queue_worker.proof.report import ReportInputError, read_claims
    from queue_worker.proof.unfenced import compare

    try:
        return compare(read_claims(location, at))
    except ReportInputError as e:
        raise small_commands.report_fail(str(e)) from None


def _unfenced_lines(location: str, at: int | None) -> list[str]:
    """The comparison's lines, wrapped to the terminal (80 columns piped, or COLUMNS)."""
    import shutil

    from supervisor.story_text import plain_width
    from supervisor.unfenced_text import wrapped_lines

    width = shutil.get_terminal_size((plain_width(), 24)).columns
    return wrapped_lines(_comparison(location, at), width)


def _unfenced_json(location: str, at: int | None) -> dict[str, Any]:
    from supervisor.unfenced_text import comparison_json

    return comparison_json(_comparison(location, at))


def _write_timeline(location: str, out: Path, *, unfenced: bool = False) -> None:
    """`--timeline`: the page, named on stderr (stdout may be the JSON); with `--rules
    unfenced`, with that layer (as `qw timeline --rules unfenced`)."""
    from queue_worker.proof.report import ReportInputError
    from supervisor.timeline.cli import write_timeline

    try:
        if unfenced:
            from supervisor.timeline.unfenced import load_layer

            write_timeline(location, out, unfenced=load_layer(location))
        else:
            write_timeline(location, out)
    except (ReportInputError, OSError) as e:
        raise small_commands.report_fail(f"--timeline {out}: {e}") from None
    typer.echo(f"qw: timeline: {out}", err=True)


def why_command(
    task_name: option_parsers.TaskArgument,
    directory: DirOption = DEFAULT_DIR,
    log: LogOption = None,
    as_json: JsonOption = False,
) -> None:
    """Every record about one task, in log order, with the rule that decided each."""
    small_commands.why(task_name, directory, log, as_json)
