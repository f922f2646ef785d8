"""The benchmark of a start on a long history (bench.history_start), tiny: the history is
built and drained, each new backlog's first CLAIM is timed from `qw up`'s launch, and
`qw status` runs after the wait it is given; every task done exactly once (the bench
checks it, as every bench run does)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench.history_start import STATUS_RUNS, rows, run_history_start


@pytest.mark.slow  # a benchmark's own check: make test-all
def test_a_tiny_history_start(tmp_path: Path) -> None:
    before = time.time()
    result = run_history_start(tmp_path, 200, 20, 2, status_after_s=0.0)
    assert len(result.first_claim_s) == 2
    # each first CLAIM came after its launch, and within the test's own run
    assert all(0 < s < time.time() - before for s in result.first_claim_s)
    assert len(result.status_s) == len(result.status_cpu_s) == 2 * STATUS_RUNS
    assert all(cpu > 0 for cpu in result.status_cpu_s)
    assert result.last_done_s >= 0
    assert rows(result)[0][0].startswith("qw up, 8 workers, 20 new tasks")
    assert not (tmp_path / "history-200").exists()  # the scratch queue is removed
