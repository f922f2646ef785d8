"""`qw replay` on a long log: what a key costs on a 1M-record claims log.

The log is `bench.long_bench.extend`'s (a CLAIM and an accepted DONE per task, eight
workers): `--tasks` tasks, twice as many claims records. It is read into a tape and the
stepper's first pass is made (its snapshots every `EVERY` records), both timed once; then
`←` is pressed at `--keys` random positions, each timed from the key to the screen's text
(the step back: a snapshot restored and up to EVERY records applied; then the moment and
its 80x24 screen, whose lanes are drawn again for the new stretch of the run), `→` the same
way, and `←` held down: 500 presses in a row from the middle. CPU time of this process
(the machine may be shared: wall time there measures the neighbours), median and worst.

    python -m bench.replay_bench [--tasks N] [--keys N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import random
import shutil
import time
from pathlib import Path

from bench.common import median
from bench.long_bench import extend
from supervisor.replay.model import EVERY, Stepper
from supervisor.replay.tape import load_tape
from supervisor.replay.view import Lanes, plain_screen


def timed_keys(stepper: Stepper, lanes: Lanes, by: int, places: list[int]) -> list[float]:
    """Seconds from a key (a step of `by`) to its screen, at each of `places`."""
    seconds = []
    for place in places:
        stepper.seek(place)
        stepper.moment()
        start = time.process_time()
        stepper.step(by)
        plain_screen(stepper.moment(), lanes, 80, 24)
        seconds.append(time.process_time() - start)
    return seconds


def held_key(stepper: Stepper, lanes: Lanes, by: int, place: int, presses: int) -> list[float]:
    """Seconds from each key to its screen, `presses` keys in a row from `place` (a key held
    down: the lanes' stretch is drawn again only when the cursor leaves it)."""
    stepper.seek(place)
    plain_screen(stepper.moment(), lanes, 80, 24)
    seconds = []
    for _ in range(presses):
        start = time.process_time()
        stepper.step(by)
        plain_screen(stepper.moment(), lanes, 80, 24)
        seconds.append(time.process_time() - start)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.replay_bench")
    parser.add_argument("--tasks", type=int, default=500_000)
    parser.add_argument("--keys", type=int, default=50)
    parser.add_argument("--dir", type=Path, default=Path("bench/out/replay"))
    options = parser.parse_args()
    data: Path = options.dir
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    try:
        extend(data, 0, options.tasks)
        start = time.process_time()
        tape = load_tape(str(data))
        read_s = time.process_time() - start
        start = time.process_time()
        stepper = Stepper(tape)
        first_pass_s = time.process_time() - start
        start = time.process_time()
        lanes = Lanes(stepper)
        plain_screen(stepper.moment(), lanes, 80, 24)
        lanes_s = time.process_time() - start
        places = random.Random(1).sample(range(1, len(tape) - 1), options.keys)
        back = timed_keys(stepper, lanes, -1, places)
        forward = timed_keys(stepper, lanes, 1, places)
        held_back = held_key(stepper, lanes, -1, len(tape) // 2, 500)
        print(f"claims records: {len(tape):,}; a snapshot every {EVERY} records")
        print(
            f"read the tape: {read_s:.2f} s; first pass: {first_pass_s:.2f} s; "
            f"first screen: {lanes_s:.2f} s"
        )
        for name, seconds in (
            ("← at a random position", back),
            ("→ at a random position", forward),
            ("← held down (500 in a row)", held_back),
        ):
            print(
                f"{name}, key to 80x24 screen: median {median(seconds) * 1000:.1f} ms, "
                f"worst {max(seconds) * 1000:.1f} ms ({len(seconds)} keys)"
            )
    finally:
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
