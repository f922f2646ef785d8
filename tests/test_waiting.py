"""The one poll loop (queue_worker.waiting) and the one percentile (queue_worker.percentile),
and the wrappers of the tests, the demos and the benchmarks around them."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import pytest

from bench.common import BenchError
from bench.common import percentile as bench_percentile
from bench.common import wait_for as bench_wait_for
from queue_worker.percentile import nearest_rank
from queue_worker.waiting import WaitTimeout, wait_until
from queue_worker.worker.stats import percentile as stats_percentile
from supervisor.demos.fleet import DemoFailed
from supervisor.demos.fleet import wait_for as demo_wait_for
from tests import helpers


def test_ready_is_the_first_truthy_answer_and_it_is_returned() -> None:
    answers: Iterator[object] = iter([None, False, 0, "", [], {}, ["found"]])
    calls = itertools.count(1)

    def condition() -> object:
        next(calls)
        return next(answers)

    assert wait_until(condition, 30, "a list") == ["found"]
    assert next(calls) == 8  # asked 7 times: every falsy answer meant "not yet"


def test_a_condition_never_met_times_out_naming_what() -> None:
    with pytest.raises(WaitTimeout) as caught:
        wait_until(lambda: None, 0.01, "the moon")
    assert str(caught.value) == "timed out after 0.01 s waiting for the moon"
    assert (caught.value.what, caught.value.timeout) == ("the moon", 0.01)


def test_each_caller_words_the_timeout_its_own_way() -> None:
    with pytest.raises(pytest.fail.Exception, match=r"timed out after 0.01s waiting for x"):
        helpers.wait_until(lambda: 0, 0.01, "x")
    with pytest.raises(DemoFailed, match=r"^timed out after 0.01 s waiting for y$"):
        demo_wait_for(lambda: None, 0.01, "y")
    with pytest.raises(BenchError, match=r"^timed out after 0s waiting for z$"):
        bench_wait_for(lambda: False, 0.01, "z")


def test_the_wrappers_mean_the_same_by_ready() -> None:
    for wait in (demo_wait_for, bench_wait_for, helpers.wait_until):
        answers: Iterator[object] = iter([0, [], 7])
        assert wait(answers.__next__, 30, "seven") == 7


def test_nearest_rank() -> None:
    values = [10, 20, 30, 40, 50]
    assert [nearest_rank(values, q) for q in (0.0, 0.5, 0.9, 0.99, 1.0)] == [10, 30, 50, 50, 50]
    assert nearest_rank([1.5, 2.5], 0.5) == 1.5  # rank round(0.5) = 0: half to even
    assert nearest_rank([7], 0.99) == 7
    with pytest.raises(IndexError):
        nearest_rank([], 0.5)


def test_the_wrappers_say_what_no_values_are() -> None:
    assert stats_percentile([], 0.5) == 0
    assert math.isnan(bench_percentile([], 0.5))
    assert bench_percentile([50, 10, 40, 20, 30], 0.5) == 30  # any order
    assert stats_percentile([10, 20, 30, 40, 50], 0.9) == 50
