"""The live dashboard in a terminal: the Live loop, the keys, and the terminal put back.

`run_dashboard(sup)` draws `dashboard.full_screen(sup.snapshot())` a few times a second on
the alternate screen and turns keys into the supervisor's controls:

    k        kill -9 a worker that holds a task (or the selected worker)
    ↑ ↓      select the previous / next worker (0-9 select slots 0-9); then k kills it,
             p pauses/resumes it; Esc clears the selection (then the filter)
    + / -    add / remove a worker
    /        type a filter for the event feed (a task id or a worker); Enter applies it
    ?        every key
    q        drain: workers finish what they hold; the loop returns once the supervisor is done

The terminal is put back on every way out (normal return, q, an exception, SIGINT, SIGTERM):
the saved termios attributes are restored in a `finally`, after rich has left the
alternate screen and shown the cursor again. SIGTERM, unless the caller handles it, ends
the loop and then exits with 143 (128 + SIGTERM), as its default action would.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import select
import signal
import sys
import termios
import time
import tty
from collections.abc import Iterator
from types import FrameType
from typing import Protocol, TextIO

from rich.console import Console, RenderableType
from rich.live import Live

from supervisor.run.model import Controls, SupervisorSnapshot
from supervisor.tui.dashboard import View, full_screen

__all__ = [
    "BACKSPACE",
    "DOWN",
    "ENTER",
    "END",
    "ESC",
    "HOME",
    "LEFT",
    "RIGHT",
    "UP",
    "Dashboard",
    "DashboardSupervisor",
    "cbreak_keys",
    "parse_keys",
    "run_dashboard",
    "sigterm_stops",
]

#: how long the status line shows what the last key did
MESSAGE_SECONDS = 8.0
#: the longest event filter
FILTER_MAX = 40
ESC = "esc"
UP = "up"
DOWN = "down"
LEFT = "left"
RIGHT = "right"
HOME = "home"
END = "end"
ENTER = "enter"
BACKSPACE = "backspace"


class DashboardSupervisor(Controls, Protocol):
    """What the dashboard needs from the supervisor: snapshots, the controls, and an end."""

    def snapshot(self) -> SupervisorSnapshot: ...

    @property
    def finished(self) -> bool:
        """True once every worker has exited (after a drain, or a stop)."""
        ...


def run_dashboard(
    sup: DashboardSupervisor, *, refresh_per_second: float = 4.0, note: str | None = None
) -> None:
    """Show the dashboard until the supervisor has finished (`q` drains it first). `note`
    stays on the status line while no key has anything to say (the browser page's token).

    Call it with stdout on a terminal. Keys are read from stdin when stdin is a terminal too;
    otherwise the dashboard only watches. KeyboardInterrupt, and SystemExit(143) for a
    SIGTERM no handler of the caller's took, reach the caller after the terminal is restored.
    """
    period = 1.0 / max(refresh_per_second, 0.1)
    console = Console()
    dash = Dashboard(sup, note=note)
    with (
        sigterm_stops() as sigterm,
        cbreak_keys(sys.stdin) as keys,
        # auto_refresh off: frames are drawn by this loop only, so no render thread competes
        # with it; stdio is not redirected, so processes forked meanwhile keep the real one.
        Live(
            console=console,
            screen=True,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
        ) as live,
    ):
        while not sigterm.received:
            live.update(dash.frame(height=console.height), refresh=True)
            if sup.finished:
                return
            for key in keys.read(timeout=period):
                dash.on_key(key)
    # raised here, once the terminal is back: an exception raised by the signal handler
    # itself could land in the middle of the restoring
    raise SystemExit(128 + signal.SIGTERM)


class Dashboard:
    """The loop's state and its keys, without a terminal: a selection, a draining flag and
    the footer's message. `frame()` is the renderable for the current snapshot."""

    def __init__(self, sup: DashboardSupervisor, *, note: str | None = None) -> None:
        self.sup = sup
        self.note = note  # the status line's when no key has a message
        self.selected: int | None = None
        self.draining = False
        self.message: str | None = None
        self.view = View()
        self._message_until = 0.0
        self._slots: list[int] = []

    def frame(self, *, height: int, now: float | None = None) -> RenderableType:
        at = time.time() if now is None else now
        snap = self.sup.snapshot()
        self._slots = sorted(w.slot for w in snap.workers)
        if self.message is not None and at > self._message_until:
            self.message = None
        # the selection and the drain are ours the moment a key is pressed; the snapshot
        # may be a frame behind
        snap = dataclasses.replace(
            snap, selected=self.selected, draining=snap.draining or self.draining
        )
        message = self.message or self.note
        return full_screen(snap, now=at, height=height, message=message, view=self.view)

    def on_key(self, key: str, *, now: float | None = None) -> None:
        at = time.time() if now is None else now
        if self.view.typing:
            self._filter_key(key)
            return
        if self.view.help and key in ("?", ESC):
            self.view = dataclasses.replace(self.view, help=False)
            return
        self.view = dataclasses.replace(self.view, help=False)  # any other key acts, too
        sup = self.sup
        try:
            if key == "q":
                if self.draining:
                    self._say("already draining (Ctrl-C twice kills the workers now)", at)
                else:
                    self.draining = True
                    sup.drain()
                    self._say("draining: waiting for workers to finish their tasks", at)
            elif key == "k":
                if self.selected is None:
                    self._say(sup.kill_a_holder() or "no worker holds a task right now", at)
                else:
                    self._say(
                        sup.kill(self.selected) or f"slot {self.selected}: nothing to kill", at
                    )
            elif key == "p":
                if self.selected is None:
                    self._say("select a worker first (↑ ↓ or 0-9), then p", at)
                else:
                    self._say(
                        sup.toggle_pause(self.selected)
                        or f"slot {self.selected}: nothing to pause or resume",
                        at,
                    )
            elif key in ("+", "="):  # "=" is "+" without shift
                self._say(sup.add_worker() or "no worker added", at)
            elif key in ("-", "_"):
                self._say(sup.remove_worker() or "no worker to remove", at)
            elif len(key) == 1 and key in "0123456789":
                slot = int(key)
                if slot not in self._slots:
                    self._say(f"no worker in slot {slot}", at)
                else:
                    self._select(slot)
            elif key in (UP, DOWN):
                self._step(-1 if key == UP else 1)
            elif key == "/":
                self.view = dataclasses.replace(self.view, typing=True)
            elif key == "?":
                self.view = dataclasses.replace(self.view, help=True)
            elif key == ESC:
                if self.selected is not None:
                    self._select(None)
                elif self.view.filter:
                    self.view = dataclasses.replace(self.view, filter="")
                self.message = None
        except Exception as exc:  # a failed action is shown, not allowed to end the demo
            self._say(f"{key}: {type(exc).__name__}: {exc}", at)

    def _select(self, slot: int | None) -> None:
        self.selected = slot
        self.sup.select(slot)

    def _step(self, by: int) -> None:
        """Move the selection `by` rows (from nothing: down picks the first, up the last)."""
        slots = self._slots
        if not slots:
            return
        if self.selected not in slots:
            self._select(slots[0] if by > 0 else slots[-1])
        else:
            i = slots.index(self.selected)
            self._select(slots[max(0, min(len(slots) - 1, i + by))])

    def _filter_key(self, key: str) -> None:
        view = self.view
        if key == ENTER:
            self.view = dataclasses.replace(view, typing=False, filter=view.filter.strip())
        elif key == ESC:
            self.view = dataclasses.replace(view, typing=False, filter="")
        elif key == BACKSPACE:
            self.view = dataclasses.replace(view, filter=view.filter[:-1])
        elif len(key) == 1 and len(view.filter) < FILTER_MAX:
            self.view = dataclasses.replace(view, filter=view.filter + key)

    def _say(self, text: str, now: float) -> None:
        self.message = text or None
        self._message_until = now + MESSAGE_SECONDS


# -- keys ---------------------------------------------------------------------------------


#: the final byte of a plain (unmodified) arrow, Home or End key's sequence
_PLAIN = {"A": UP, "B": DOWN, "C": RIGHT, "D": LEFT, "H": HOME, "F": END}


def parse_keys(data: str) -> list[str]:
    """Split what one read returned into keys: characters, "esc" for a lone Escape, "up",
    "down", "left" and "right" for the arrows, "home", "end", "enter" and "backspace".

    Other keys that send escape sequences (ESC [ C, ESC O P, ESC [1;5A …) arrive in the same
    read; they are dropped whole, so their letters are never taken for commands.
    """
    keys: list[str] = []
    i = 0
    while i < len(data):
        ch = data[i]
        if ch == "\x1b":
            if i + 1 < len(data) and data[i + 1] in "[O":
                # CSI/SS3: parameters, then one final byte in @..~
                start = i + 2
                i = start
                while i < len(data) and not ("@" <= data[i] <= "~"):
                    i += 1
                if i < len(data) and i == start and data[i] in _PLAIN:  # no modifiers
                    keys.append(_PLAIN[data[i]])
                i += 1
                continue
            keys.append(ESC)
        elif ch in "\r\n":
            keys.append(ENTER)
        elif ch in "\x7f\x08":
            keys.append(BACKSPACE)
        elif ch.isprintable():
            keys.append(ch)
        i += 1
    return keys


class _Keys:
    """Keys from a terminal's file descriptor, or none (fd None: stdin is not a terminal)."""

    def __init__(self, fd: int | None) -> None:
        self.fd = fd

    def read(self, timeout: float) -> list[str]:
        """Wait up to `timeout` for keys; return as soon as some arrive (the next frame
        shows their effect at once)."""
        if self.fd is None:
            time.sleep(timeout)  # no keyboard: this is the frame interval, nothing to wait on
            return []
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return []
        try:
            data = os.read(self.fd, 1024)
        except OSError:  # EIO: the terminal hung up
            data = b""
        if not data:
            # hung up: select would report it readable for ever, a loop burning a core
            self.fd = None
        return parse_keys(data.decode("utf-8", errors="ignore"))


# -- the terminal -------------------------------------------------------------------------


@contextlib.contextmanager
def cbreak_keys(stream: TextIO) -> Iterator[_Keys]:
    """Keys one at a time without echo; the saved termios attributes come back on any exit.

    Yields where to read keys from: nothing, when stdin is not a terminal.
    """
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # replaced or closed stdin
        yield _Keys(None)
        return
    if not os.isatty(fd):
        yield _Keys(None)
        return
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd, termios.TCSANOW)
        yield _Keys(fd)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


class _SigtermFlag:
    received = False


@contextlib.contextmanager
def sigterm_stops() -> Iterator[_SigtermFlag]:
    """Make SIGTERM end the dashboard's loop, so the terminal is restored before exiting.

    SIGTERM's default action ends the process at once and would leave the terminal in
    cbreak mode on the alternate screen. A Python handler the caller installed before
    (`qw up` drains on SIGTERM) stays in charge: it is called, and the loop goes on until
    the supervisor has finished. SIGINT needs nothing: Python raises KeyboardInterrupt, or
    the caller's handler runs.
    """
    flag = _SigtermFlag()
    try:
        previous = signal.getsignal(signal.SIGTERM)
    except ValueError:
        yield flag
        return
    if previous == signal.SIG_IGN:
        yield flag
        return
    owner = os.getpid()

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != owner:
            # a process forked (not exec'd) while the dashboard ran inherits this handler:
            # give it the plain default death its parent expects
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
        elif callable(previous):
            previous(signum, frame)
        else:
            flag.received = True  # the loop sees it within a frame

    try:
        signal.signal(signal.SIGTERM, on_sigterm)
    except ValueError:  # not the main thread: signals cannot be handled here
        yield flag
        return
    try:
        yield flag
    finally:
        # None: a handler not installed from Python; the default is the closest to it
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
