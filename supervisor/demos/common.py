"""What every demo returns, where it works, and how it speaks."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from supervisor.console import PLAIN_WIDTH as PLAIN_WIDTH  # re-exported: the demos use them
from supervisor.console import stdout_console as stdout_console


@dataclass(frozen=True)
class DemoResult:
    """Did the demo show what it claims? `summary` says what it showed, or why not."""

    shown: bool
    summary: str

    @property
    def exit_code(self) -> int:
        return 0 if self.shown else 1


@contextlib.contextmanager
def data_dir(given: Path | None, keep: bool, say: Narrator) -> Iterator[Path]:
    """The demo's data directory: the one given (kept), or a fresh temporary one.

    A temporary one is removed once the demo has shown what it claims (`say.result` with
    shown=True, before or after the `with` block ends) unless `keep`. A demo that failed,
    or stopped with an exception, keeps it — the logs and the workers' output (run/*.out)
    are what explain a failure — and the narrator names it."""
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        yield given
        return
    made = Path(tempfile.mkdtemp(prefix="qw-demo-"))

    def tidy(result: DemoResult) -> None:
        if result.shown and not keep:
            shutil.rmtree(made, ignore_errors=True)
        elif result.shown:
            say.note(f"data kept in {made}")
        else:
            say.note(f"data kept in {made} (the logs and run/*.out say what happened)")

    try:
        yield made
    except BaseException:
        say.note(f"data kept in {made}")
        raise
    if say.outcome is not None:
        tidy(say.outcome)
    else:
        say.on_result(tidy)


class Narrator:
    """Numbered steps on a console; plain text when it is not a terminal."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.steps = 0
        self.outcome: DemoResult | None = None  # what `result` said, once it has
        self._then: list[Callable[[DemoResult], None]] = []

    def title(self, text: str) -> None:
        self.console.print(f"\n{text}", style="bold", markup=False, highlight=False)

    def say(self, text: str) -> None:
        self.steps += 1
        self.console.print(f"{self.steps:>2}. {text}", markup=False, highlight=False)

    def note(self, text: str) -> None:
        self.console.print(f"    {text}", markup=False, highlight=False, style="dim")

    def result(self, result: DemoResult) -> DemoResult:
        style = "bold green" if result.shown else "bold red"
        word = "shown" if result.shown else "NOT shown"
        self.console.print(f"\n{word}: {result.summary}", style=style, markup=False)
        self.outcome = result
        then, self._then = self._then, []
        for action in then:
            action(result)
        return result

    def on_result(self, action: Callable[[DemoResult], None]) -> None:
        """Call `action` with the result once `result` is called."""
        self._then.append(action)


def write_demo_timeline(
    say: Narrator, location: Path, name: str, kept: bool, *, unfenced: bool = False
) -> Path | None:
    """Write the run's `qw timeline` page and name it: in the data directory when that is
    kept, else in the system's temporary directory (the data directory is removed). With
    `unfenced`, the page has the original's rules as a second layer (`--rules unfenced`)."""
    from queue_worker.proof.report import ReportInputError
    from supervisor.timeline.cli import write_timeline

    out = location / "timeline.html" if kept else Path(tempfile.gettempdir()) / f"qw-{name}.html"
    try:
        if unfenced:
            from supervisor.timeline.unfenced import load_layer

            write_timeline(str(location), out, unfenced=load_layer(str(location)))
        else:
            write_timeline(str(location), out)
    except (ReportInputError, OSError) as e:
        say.note(f"no timeline: {e}")
        return None
    say.note(f"timeline: {out} (open it in a browser)")
    return out


def record_skew(location: Path, name: str, worker_id: str, offset_s: float) -> None:
    """Note in the ops topic that this demo runs a worker on a clock `offset_s` off."""
    from queue_worker.ops import BY_DEMO
    from supervisor.run.ops_recorder import OpsRecorder, ProcessRef

    recorder = OpsRecorder(location, by=BY_DEMO)
    recorder.skewed(ProcessRef(name, worker_id, os.getpid()), f"clock {offset_s:+g} s")
    recorder.close()
