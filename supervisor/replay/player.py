"""The player: keys to moves of the `Stepper`, the screen redrawn, the terminal put back.

`Player` is the loop's state without a terminal (tests drive it with keys); `run_player`
puts it on the alternate screen with rich's Live, reads keys in cbreak mode (the
dashboard's own helpers: supervisor.tui.live), and restores the terminal on every way out.

Playing (`space`) keeps the run's own pace: the tape's clock advances with the wall clock
times the speed (`+` doubles it, `-` halves it), and the cursor follows it record by record.
"""

from __future__ import annotations

import signal
import sys
import time
from typing import Final

from rich.console import Console, Group, RenderableType
from rich.live import Live

from supervisor.replay.model import Stepper
from supervisor.replay.view import Lanes, help_lines, screen_lines
from supervisor.timeline.model import Model
from supervisor.timeline.view import BoundError, parse_bound
from supervisor.tui.live import (
    BACKSPACE,
    END,
    ENTER,
    ESC,
    HOME,
    LEFT,
    RIGHT,
    cbreak_keys,
    sigterm_stops,
)

#: frames a second while playing (idle, the loop waits for keys)
FPS: Final = 20
SPEEDS: Final = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8, 16, 32, 64, 128)
#: what `g` and `/` ask for
PROMPTS: Final = {
    "g": "go to (@position, 12:00:01.5 or +4.5s): ",
    "/": "follow (task id or worker, empty: all): ",
}
INPUT_MAX: Final = 40


class Player:
    """The player's state: the stepper, playing or not, what is typed, the last message."""

    def __init__(self, stepper: Stepper, location: str = "") -> None:
        self.stepper = stepper
        self.lanes = Lanes(stepper)
        self.location = location
        self.playing = False
        self.speed = 1.0
        self.typing: str | None = None  # "g" or "/" while a line is typed
        self.typed = ""
        self.message: str | None = None
        self.help = False
        self.done = False
        self._anchor = (0.0, 0)  # (wall clock, tape clock) when playing began or sped
        # the run's span as `parse_bound` reads a time (+4.5s counts from its start)
        self._span = Model((), (), (), (), (), (), (), self.lanes.start, self.lanes.end)

    def frame(self, width: int, height: int) -> RenderableType:
        if self.help:
            return Group(*help_lines(width))
        return Group(
            *screen_lines(
                self.stepper.moment(),
                self.lanes,
                width,
                height,
                location=self.location,
                status=self._status(),
            )
        )

    def _status(self) -> str:
        if self.typing is not None:
            return PROMPTS[self.typing] + self.typed + "▏"
        parts = []
        if self.playing:
            parts.append(f"▶ playing ×{self.speed:g}")
        if self.message:
            parts.append(self.message)
        return "  ".join(parts) or "paused" + (f" ×{self.speed:g}" if self.speed != 1 else "")

    def on_key(self, key: str, now: float | None = None) -> None:
        wall = time.monotonic() if now is None else now
        if self.typing is not None:
            self._type(key)
            return
        if self.help:
            self.help = False
            return
        s = self.stepper
        self.message = None
        if key == "q":
            self.done = True
        elif key in (RIGHT, LEFT):
            self.playing = False
            before = s.index
            s.step(1 if key == RIGHT else -1)
            if s.index == before:
                where = "later" if key == RIGHT else "earlier"
                whose = f" of {s.follow.label}" if s.follow is not None else ""
                self.message = f"no {where} record{whose}"
        elif key in ("]", "["):
            self.playing = False
            event = s.next_event() if key == "]" else s.previous_event()
            if event is None:
                self.message = f"no {'later' if key == ']' else 'earlier'} event"
                if s.follow is not None:
                    self.message += f" of {s.follow.label}"
            else:
                self.message = ", ".join(e.kind for e in s.events_here())
        elif key == " ":
            self.playing = not self.playing
            if self.playing and s.index >= len(s.tape) - 1:
                s.seek(-1)  # at the end: play from the start
            self._anchor_now(wall)
        elif key in ("+", "="):
            self._speed(1, wall)
        elif key in ("-", "_"):
            self._speed(-1, wall)
        elif key in PROMPTS:
            self.playing = False
            self.typing, self.typed = key, ""
        elif key == "?":
            self.help = True
        elif key == HOME:
            s.seek(-1)
        elif key == END:
            s.seek(len(s.tape) - 1)

    def _speed(self, by: int, wall: float) -> None:
        i = SPEEDS.index(self.speed) if self.speed in SPEEDS else SPEEDS.index(1)
        self.speed = SPEEDS[max(0, min(len(SPEEDS) - 1, i + by))]
        self.message = f"speed ×{self.speed:g}"
        self._anchor_now(wall)

    def _anchor_now(self, wall: float) -> None:
        tape, i = self.stepper.tape, self.stepper.index
        clock = tape.clock[i] if i >= 0 else (tape.clock[0] if len(tape) else 0)
        self._anchor = (wall, clock)

    def tick(self, now: float | None = None) -> bool:
        """While playing: move the cursor to where the run's clock has come. True when
        it moved."""
        if not self.playing:
            return False
        wall = time.monotonic() if now is None else now
        s, tape = self.stepper, self.stepper.tape
        start_wall, start_clock = self._anchor
        target = start_clock + round((wall - start_wall) * self.speed * 1_000_000)
        index = tape.index_at_time(target)
        if s.follow is not None:
            import bisect

            indices = s.follow.indices
            at = bisect.bisect_right(indices, index) - 1
            index = indices[at] if at >= 0 else s.index
        moved = index > s.index
        if moved:
            s.seek(index)
        if s.index >= len(tape) - 1 or (s.follow is not None and s.index >= s.follow.indices[-1]):
            self.playing = False
            self.message = "the end of the tape"
        return moved

    def _type(self, key: str) -> None:
        if key == ESC:
            self.typing = None
        elif key == BACKSPACE:
            self.typed = self.typed[:-1]
        elif key == ENTER:
            what, text = self.typing, self.typed.strip()
            self.typing = None
            self.message = self._go(text) if what == "g" else self.stepper.follow_text(text)
            if what == "/" and self.message is None:
                follow = self.stepper.follow
                self.message = f"following {follow.label}" if follow else "following everything"
        elif len(key) == 1 and len(self.typed) < INPUT_MAX:
            self.typed += key

    def _go(self, text: str) -> str | None:
        s = self.stepper
        if not text:
            return None
        if text.lstrip("@").isdigit():
            s.go_position(int(text.lstrip("@")))
            return None
        try:
            s.go_time(parse_bound(text, self._span))
        except BoundError as e:
            return f"g: {e}"
        return None


def run_player(player: Player) -> None:
    """Show the player until `q` (or SIGTERM, or Ctrl-C); the terminal is put back."""
    console = Console()
    with (
        sigterm_stops() as sigterm,
        cbreak_keys(sys.stdin) as keys,
        Live(
            console=console,
            screen=True,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
        ) as live,
    ):
        dirty = True
        while not sigterm.received and not player.done:
            if dirty:
                live.update(player.frame(console.width, console.height), refresh=True)
            timeout = 1 / FPS if player.playing else 0.5
            pressed = keys.read(timeout=timeout)
            for key in pressed:
                player.on_key(key)
            moved = player.tick()
            dirty = bool(pressed) or moved or player.playing or not pressed
    if sigterm.received:
        raise SystemExit(128 + signal.SIGTERM)


__all__ = ["Player", "run_player"]
