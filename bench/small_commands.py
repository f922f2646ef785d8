"""The small commands against another checkout's, interleaved: CPU and wall medians.

    python -m bench.small_commands --before /work/main/.venv/bin/qw --runs 9

Each round runs every command once with each `qw` (and `python -c pass` of each venv), in
turn, so that a burst of load hits both alike; the table gives the medians of CPU time
(user + system of the process and its children, from wait4) and of wall time, and CPU as
a multiple of this venv's `python -c pass`. Each `qw` runs on its own copy of one queue
of 100 tasks (enqueue adds one each round); with `--drained N`, of N tasks that `qw up` has
worked (a claims log of 2N records that `status`, `task` and `why` fold whole):

    python -m bench.small_commands --before /work/main/.venv/bin/qw --drained 3000

With `--instructions`, each command runs once more with each `qw` under valgrind's callgrind
(after a warm run) and the table gives its instructions instead, and as a multiple of its
venv's `python -c pass`: a count that a shared machine's load leaves alone (valgrind must be
on PATH; ~3 s a command).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: each `qw` imports its own checkout (no PYTHONPATH, which the bench's environment sets to
#: this one), and writes bytecode caches as a user's does
USER_ENV = {
    k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")
}

COMMANDS = [
    ["--help"],
    ["status"],
    ["enqueue", "--count", "1", "--fsync", "none"],
    ["task", "0"],
    ["why", "0"],
    ["up", "--help"],
]


def _python_of(qw: str) -> str:
    return str(Path(qw).with_name("python"))


def _timed(argv: list[str], cwd: Path) -> tuple[int, float]:
    process = subprocess.Popen(
        argv, cwd=cwd, env=USER_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(process.pid, 0)
    return os.waitstatus_to_exitcode(status), usage.ru_utime + usage.ru_stime


def _instructions(argv: list[str], cwd: Path, out: Path) -> int:
    """The instructions of one run of `argv` (all its threads), counted by callgrind."""
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    done = subprocess.run([*valgrind, *argv], cwd=cwd, env=USER_ENV, capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"{argv} under valgrind exited with {done.returncode}")
    for line in out.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"{out}: no summary line")


def count_instructions(before: str, after: str, drained: int = 0) -> list[list[str]]:
    """`measure`'s table in instructions: one run of each command with each `qw`."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "queue").mkdir()
        make_queue(after, root / "queue", drained)
        counts: dict[tuple[str, str], int] = {}
        rows = [(["python -c pass"], "pass"), *((c, "qw") for c in COMMANDS)]
        for name, qw in (("before", before), ("after", after)):
            shutil.copytree(root / "queue", root / name)
            for args, kind in rows:
                argv = [_python_of(qw), "-c", "pass"] if kind == "pass" else [qw, *args]
                subprocess.run(argv, cwd=root / name, env=USER_ENV, capture_output=True)  # warm
                out = root / f"callgrind-{name}.out"
                counts[(" ".join(args), name)] = _instructions(argv, root / name, out)
        bare = {n: counts[("python -c pass", n)] for n in ("before", "after")}
        table = []
        for args, kind in rows:
            label = "python -c pass" if kind == "pass" else "qw " + " ".join(args)
            b, a = (counts[(" ".join(args), n)] for n in ("before", "after"))
            table.append(
                [
                    f"`{label}`",
                    f"{b / 1e6:.1f}M",
                    f"{a / 1e6:.1f}M",
                    f"{b / bare['before']:.2f}×",
                    f"{a / bare['after']:.2f}×",
                ]
            )
        return table


def make_queue(qw: str, directory: Path, drained: int) -> None:
    """The queue the commands read: 100 tasks enqueued, or `drained` tasks worked."""
    if drained:
        command = [qw, "up", "--tasks", str(drained), "--work-ms", "0", "--workers", "2"]
        command += ["--fsync", "none", "--no-tui", "--exit-when-drained"]
    else:
        command = [qw, "enqueue", "--count", "100", "--fsync", "none"]
    subprocess.run(command, cwd=directory, env=USER_ENV, check=True, capture_output=True)


def measure(before: str, after: str, runs: int, drained: int = 0) -> list[list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "queue").mkdir()
        make_queue(after, root / "queue", drained)
        for name, qw in (("before", before), ("after", after)):
            shutil.copytree(root / "queue", root / name)  # the same records for both
            for warm in COMMANDS:  # bytecode caches written, as a user's second run
                subprocess.run([qw, *warm], cwd=root / name, env=USER_ENV, capture_output=True)
        rows = [(["python -c pass"], "pass"), *((c, "qw") for c in COMMANDS)]
        cpu: dict[tuple[str, str], list[float]] = {}
        wall: dict[tuple[str, str], list[float]] = {}
        for _ in range(runs):
            for args, kind in rows:
                for name, qw in (("before", before), ("after", after)):
                    argv = [_python_of(qw), "-c", "pass"] if kind == "pass" else [qw, *args]
                    began = time.perf_counter()
                    code, used = _timed(argv, root / name)
                    key = (" ".join(args), name)
                    wall.setdefault(key, []).append(time.perf_counter() - began)
                    cpu.setdefault(key, []).append(used)
                    if code != 0:
                        raise SystemExit(f"{argv} exited with {code}")
        bare = statistics.median(cpu[("python -c pass", "after")])
        bare_wall = statistics.median(wall[("python -c pass", "after")])
        table = []
        for args, kind in rows:
            label = "python -c pass" if kind == "pass" else "qw " + " ".join(args)
            command = " ".join(args)
            b_cpu, a_cpu = (
                statistics.median(cpu[(command, n)]) * 1000 for n in ("before", "after")
            )
            b_wall, a_wall = (
                statistics.median(wall[(command, n)]) * 1000 for n in ("before", "after")
            )
            table.append(
                [
                    f"`{label}`",
                    f"{b_cpu:.0f} ms",
                    f"{a_cpu:.0f} ms",
                    f"{b_cpu / (bare * 1000):.1f}×",
                    f"{a_cpu / (bare * 1000):.1f}×",
                    f"{b_wall:.0f} ms",
                    f"{a_wall:.0f} ms",
                    f"{b_wall / (bare_wall * 1000):.1f}×",
                    f"{a_wall / (bare_wall * 1000):.1f}×",
                ]
            )
        return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the other checkout's qw script")
    parser.add_argument("--after", default=shutil.which("qw", path=os.path.dirname(sys.executable)))
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--drained", type=int, default=0, help="a queue of N tasks worked")
    parser.add_argument(
        "--instructions", action="store_true", help="instructions (valgrind), not CPU time"
    )
    options = parser.parse_args()
    if options.instructions:
        head = ["command", "before", "after", "before × pass", "after × pass"]
        print(f"| {' | '.join(head)} |")
        print("|---|" + "---:|" * (len(head) - 1))
        for row in count_instructions(options.before, options.after, options.drained):
            print(f"| {' | '.join(row)} |")
        return 0
    head = ["command", "CPU before", "CPU after", "before × pass", "after × pass"]
    head += ["wall before", "wall after", "before × pass (wall)", "after × pass (wall)"]
    print(f"| {' | '.join(head)} |")
    print("|---|" + "---:|" * (len(head) - 1))
    for row in measure(options.before, options.after, options.runs, options.drained):
        print(f"| {' | '.join(row)} |")
    print(f"\n(load average {os.getloadavg()[0]:.1f} at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
