"""The `qw timeline` command: read the logs, narrow, write the page (or draw in the terminal)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final

import typer

from supervisor.options import (
    DEFAULT_DIR,
    DirOption,
    LogOption,
    fail,
    location_of,
    one_of,
    shown,
)

if TYPE_CHECKING:
    from supervisor.timeline.unfenced import Layer
    from supervisor.timeline.view import View

# The model, the view and the page are imported when `qw timeline` runs, not by every `qw`.

#: the page's name when --out is not given (in the data directory, or here for --log)
DEFAULT_NAME: Final = "timeline.html"


def register(app: typer.Typer) -> None:
    """Add `timeline` to the `qw` app."""
    app.command(
        epilog="Examples:  qw timeline  ·  qw timeline --tasks 3,10-12  ·  "
        "qw timeline --from +2s --to +6s --text"
    )(timeline)


def default_out(directory: Path, log: str | None) -> Path:
    return Path(DEFAULT_NAME) if log is not None else directory / DEFAULT_NAME


def write_timeline(
    location: str, out: Path, view_of: View | None = None, unfenced: Layer | None = None
) -> View:
    """Write the page of the whole run at `location` (or of `view_of`) to `out`; with
    `unfenced`, the original's rules as a second layer."""
    from supervisor.timeline.load import load_model
    from supervisor.timeline.page import render_page
    from supervisor.timeline.view import select

    view = view_of if view_of is not None else select(load_model(location))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_page(view, shown(location), unfenced), encoding="utf-8")
    return view


def timeline(
    directory: DirOption = DEFAULT_DIR,
    log: LogOption = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", metavar="FILE", help="Write the page here (default: DIR/timeline.html)."
        ),
    ] = None,
    start: Annotated[
        str | None,
        typer.Option(
            "--from",
            metavar="POSITION|TIME",
            help="Begin at a claims-log position (@120), a time (12:00:01.5) or +SECONDS "
            "after the run's first record.",
        ),
    ] = None,
    end: Annotated[
        str | None, typer.Option("--to", metavar="POSITION|TIME", help="End there (as --from).")
    ] = None,
    tasks: Annotated[
        str | None, typer.Option("--tasks", metavar="IDS", help="Only these tasks: 3,5,10-20.")
    ] = None,
    text: Annotated[
        bool, typer.Option("--text", help="Draw the lanes in the terminal instead.")
    ] = False,
    rules: Annotated[
        str,
        typer.Option(
            "--rules",
            parser=one_of("qw", "unfenced"),
            metavar="qw|unfenced",
            help="unfenced: add the original's rules as a second layer (the DONEs they "
            "would accept that qw refused, the tasks they would complete twice).",
        ),
    ] = "qw",
) -> None:
    """Draw the run as a picture: one lane per worker process, each claim a bar from CLAIM to
    DONE with its lease, takeovers as arrows, kills and pauses as windows, and charts. On a
    partitioned queue, a section per partition (--tasks then takes PARTITION:IDS).

    Writes one self-contained HTML file (no script, nothing from the network) and prints its
    path. A large run is narrowed to a readable window (the page says what it left out).
    """
    from queue_worker.proof.report import ReportInputError
    from supervisor.timeline.load import load_model
    from supervisor.timeline.view import BoundError, parse_bound, parse_tasks, select

    location = location_of(directory, log)
    target = out if out is not None else default_out(directory, log)
    if rules != "qw" and _has_partitions(location):
        fail(f"--rules {rules}: {shown(location)} is a partitioned queue; give one partition's")
    if _partitioned(location, target, tasks, start, end, text=text):
        return
    layer = None
    try:
        model = load_model(location)
        if rules == "unfenced":
            from supervisor.timeline.unfenced import load_layer

            layer = load_layer(location)
    except ReportInputError as e:
        fail(str(e))
    try:
        wanted = parse_tasks(tasks) if tasks is not None else None
    except BoundError as e:
        fail(f"--tasks: {e}")
    bounds: list[int | None] = []
    for option, value in (("--from", start), ("--to", end)):
        try:
            bounds.append(parse_bound(value, model) if value is not None else None)
        except BoundError as e:
            fail(f"{option}: {e}")
    try:
        view = select(model, wanted, *bounds)
    except BoundError as e:
        fail(f"--from/--to: {e}")
    if text:
        from supervisor.timeline.text import print_lanes

        if layer is None:
            print_lanes(view)
        else:
            from supervisor.timeline.unfenced import text_lines

            print_lanes(view, extra=text_lines(layer, view))
        return
    try:
        write_timeline(location, target, view, layer)
    except OSError as e:
        fail(f"cannot write {target}: {e.strerror or e}")
    for note in view.notes:
        typer.echo(f"qw: {note}", err=True)
    typer.echo(str(target))


def _has_partitions(location: str) -> bool:
    from logstore import LogError
    from queue_worker.partition_layout import read_manifest

    try:
        return read_manifest(location) is not None
    except (LogError, ValueError) as e:
        fail(str(e))


def _partitioned(
    location: str, out: Path, tasks: str | None, start: str | None, end: str | None, *, text: bool
) -> bool:
    """`qw timeline` on a partitioned queue: a section per partition (False: the queue has
    no partitions)."""
    from logstore import LogError
    from queue_worker.partition_layout import read_manifest

    try:
        manifest = read_manifest(location)
    except (LogError, ValueError) as e:
        fail(str(e))
    if manifest is None:
        return False
    from queue_worker.proof.report import ReportInputError
    from supervisor.timeline.partitioned import load_partition_views, write_page
    from supervisor.timeline.view import BoundError

    try:
        parts = load_partition_views(location, manifest, tasks, start, end)
    except (ReportInputError, BoundError) as e:
        fail(str(e))
    if text:
        from supervisor.timeline.text import print_lanes

        for k, view in parts.views:
            typer.echo(f"── partition {k} (task n here is {k}:n)")
            print_lanes(view)
        return True
    try:
        write_page(parts, shown(location), out)
    except OSError as e:
        fail(f"cannot write {out}: {e.strerror or e}")
    for note in parts.notes:
        typer.echo(f"qw: {note}", err=True)
    typer.echo(str(out))
    return True


__all__ = ["default_out", "register", "write_timeline"]
