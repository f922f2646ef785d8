"""The job-queue benchmark (bench/jobs_bench.py): each tool's program really runs — its
workers launched as its users launch them, every result read and checked — and a wrong
result fails the run with a line that names it. Huey's and RQ's runs need the bench extra
(`pip install -e '.[bench]'`): skipped without it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from bench import jobs_bench, jobs_huey, jobs_rq
from bench.common import BenchError
from bench.jobs_program import JobsRun, run_program
from tests.helpers import redis_server_binary

CALLS = 40
RUNS: dict[str, Callable[[Path, int, int], JobsRun]] = {
    "qw": jobs_bench.run_qw,
    "Huey": jobs_huey.run,
    "RQ": jobs_rq.run,
}


@pytest.mark.parametrize("tool", RUNS)
def test_each_tools_program_reads_every_result(tmp_path: Path, tool: str) -> None:
    if tool != "qw":  # (the bench extra's: `pip install -e '.[bench]'`)
        pytest.importorskip({"Huey": "huey", "RQ": "rq"}[tool])
    if tool == "RQ":
        redis_server_binary()  # (skips without one, unless QW_REQUIRE_REDIS=1)
    run = RUNS[tool](tmp_path, CALLS, 2)
    assert (run.tool, run.calls) == (tool, CALLS)
    assert 0 < run.startup_s < run.total_s and 0 < run.span_s < run.total_s


def test_a_wrong_result_fails_the_run_naming_the_call(tmp_path: Path) -> None:
    program = jobs_bench.qw_program(2)
    wrong = dataclasses.replace(program, jobs=program.jobs.replace("a + b", "a + b + 1"))
    with pytest.raises(BenchError, match=r"add\(0, 0\) returned 1, expected 0"):
        run_program(wrong, tmp_path, CALLS, lambda: True)
