"""`qw demo …`: offline teaching scenarios, each on a fresh temporary data directory.

    collisions      one backlog under pick=first / random / spread: lost attempts per strategy
    redistribution  kill -9 a worker that holds a task; a survivor takes it over
    pause           SIGSTOP a holder until it is taken over: its late DONE is refused
    skew            a worker whose clock runs ahead steals a live lease; a slow one cannot

Each narrates what happened with log positions and exits 0 only when it showed what it
claims (1 with why, otherwise). The modules are imported when their command runs.

They may import `logstore`, `queue_worker`, the shared modules at the root of
`supervisor`, `supervisor.run` and `supervisor.timeline`; never `supervisor.cli`
(tests/test_layers.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from supervisor.options import data_directory, real, whole

if TYPE_CHECKING:
    from rich.console import Console


def _console() -> Console:
    """The console a demo narrates on (rich is imported when a demo runs, not by `qw`)."""
    from supervisor.demos.common import stdout_console

    return stdout_console()


demo_app = typer.Typer(
    help="Offline teaching scenarios (real worker processes on a temporary directory).",
    no_args_is_help=True,
)

DirOption = Annotated[
    Path | None,
    typer.Option(
        "--dir",
        "-d",
        parser=data_directory,
        metavar="DIR",
        help="Work here (kept) instead of a fresh temporary directory.",
    ),
]
KeepOption = Annotated[
    bool, typer.Option("--keep", help="Keep the temporary directory (its path is printed).")
]


# Bounds go through cli_options' parsers rather than typer's min/max: typer words a value
# out of range without quoting it ("Input should be less than or equal to 64").
def _seconds(help: str) -> Any:  # typer.Option is typed as returning Any
    return typer.Option(parser=real("seconds", 0.05, 600.0), metavar="SECONDS", help=help)


def _count(what: str, low: int, high: int, help: str) -> Any:
    metavar = "MS" if what == "milliseconds" else "N"
    return typer.Option(parser=whole(what, low, high), metavar=metavar, help=help)


@demo_app.command("collisions")
def collisions_command(
    workers: Annotated[int, _count("a number of workers", 2, 64, help="Workers in each run.")] = 8,
    tasks: Annotated[int, _count("a number of tasks", 1, 100_000, help="The backlog.")] = 400,
    work_ms: Annotated[int, _count("milliseconds", 0, 10_000, help="Work per task.")] = 5,
    directory: DirOption = None,
    keep: KeepOption = False,
) -> None:
    """One backlog under pick=first, random and spread: a table of lost claim attempts."""
    from supervisor.demos import collisions as demo

    options = demo.CollisionOptions(workers, tasks, work_ms, directory=directory, keep=keep)
    raise typer.Exit(demo.run(_console(), options).exit_code)


@demo_app.command("redistribution")
def redistribution_command(
    workers: Annotated[int, _count("a number of workers", 2, 64, help="Worker processes.")] = 3,
    tasks: Annotated[int, _count("a number of tasks", 1, 10_000, help="Tasks enqueued.")] = 6,
    lease: Annotated[float, _seconds("Each claim's lease.")] = 2.0,
    work_ms: Annotated[int, _count("milliseconds", 1, 600_000, help="Work per task.")] = 1500,
    directory: DirOption = None,
    keep: KeepOption = False,
) -> None:
    """kill -9 a worker that holds a task; a survivor takes it over once the lease is out."""
    from supervisor.demos import redistribution as demo

    options = demo.RedistributionOptions(
        workers, tasks, lease, work_ms, directory=directory, keep=keep
    )
    raise typer.Exit(demo.run(_console(), options).exit_code)


@demo_app.command("pause")
def pause_command(
    lease: Annotated[float, _seconds("Each claim's lease.")] = 1.0,
    work_ms: Annotated[
        int, _count("milliseconds", 1, 600_000, help="Work per task (longer than the lease).")
    ] = 2500,
    directory: DirOption = None,
    keep: KeepOption = False,
) -> None:
    """Fencing: SIGSTOP a holder until it is taken over, SIGCONT it; its DONE is refused."""
    from supervisor.demos import pause as demo

    options = demo.PauseOptions(lease, work_ms, directory=directory, keep=keep)
    raise typer.Exit(demo.run(_console(), options).exit_code)


@demo_app.command("skew")
def skew_command(
    lease: Annotated[float, _seconds("Each claim's lease.")] = 2.0,
    skew: Annotated[
        float, _seconds("How far one clock runs ahead and one behind (more than the lease).")
    ] = 3.0,
    work_ms: Annotated[
        int, _count("milliseconds", 1, 600_000, help="The robbed worker's work.")
    ] = 6000,
    directory: DirOption = None,
    keep: KeepOption = False,
) -> None:
    """Clock skew: a fast clock steals a live lease (every reader agrees); a slow one cannot."""
    from supervisor.demos import skew as demo

    options = demo.SkewOptions(lease, skew, work_ms, directory=directory, keep=keep)
    raise typer.Exit(demo.run(_console(), options).exit_code)
