"""The fast part of the attack list (tests/attacks): each must be HELD. `make attack` runs
them all, slow ones included, and prints the verdicts.

An attack that has a test of its own, on the same damage and the same path, is left to
`make test-all` (marked slow): `make test` runs that test instead. `COVERED_BY` names it,
and `test_every_covering_test_exists` keeps the names true.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.attacks.catalog import ATTACKS, Attack
from tests.attacks.harness import Verdict

TESTS = Path(__file__).parent
_SAME_ENCODING = "test_worker_failures.py::test_a_value_whose_encoding_raises_is_a_fail_saying_what"
_CLOCK_JUMP = (
    "test_worker_failures.py::test_a_clock_jump_is_named_in_the_events_qw_why_and_the_report"
)
#: attack -> the fast test (file::function) that holds the same line
COVERED_BY: dict[str, str] = {
    "HTTP clients that hang up (slowloris, then reset)":
        "test_http.py::test_clients_that_hang_up_print_no_tracebacks",
    "a partitioned queue's manifest removed":
        "test_partition_layout.py::test_a_removed_manifest_is_refused_even_when_asked_for_the_same_count",
    "a partition's directory removed":
        "test_partition_layout.py::test_an_enqueue_checks_every_partition_before_it_appends_to_any",
    "a handler returning a 20 MB string":
        "test_worker_failures.py::test_a_result_over_the_record_limit_is_a_fail_naming_the_limit_and_the_size",
    "a handler that calls os._exit (poison pill)":
        "test_poison.py::test_a_task_that_kills_its_worker_goes_dead_after_max_attempts",
    "a handler returning a dict whose items() raises": _SAME_ENCODING,
    "a handler raising an exception whose __str__ raises": _SAME_ENCODING,
    "--dir '' (the empty path)":
        "test_partition_layout.py::test_an_empty_data_directory_is_refused",
    "a byte flipped in the last DONE of claims.log, below its forced offset":
        "test_cut_rule.py::test_a_record_damaged_below_the_forced_offset_is_not_cut_as_a_torn_tail",
    "a flipped byte in fold.checkpoint of a compacted queue":
        "test_checkpoint_recover.py::test_a_damaged_checkpoint_is_refused_naming_the_command_that_puts_the_previous_back",
    "garbage written 4,000 bytes into the zeros after claims.log's last record":
        "test_cut_rule.py::test_garbage_in_the_zeros_after_the_last_record_is_damage_to_every_reader",
    "a worker named with terminal escapes":
        "test_hostile_records.py::test_a_worker_name_with_escapes_is_printed_escaped",
    "auditing a read-only copy (0444 files in a 0555 directory)":
        "test_readonly.py::test_looking_at_a_read_only_archive_works_and_writes_nothing",
    "damage in claims.log that only a restarted worker meets":
        "test_damage.py::test_damage_only_a_restarted_worker_meets_stops_the_run",
    "a handler leaving a non-daemon thread, then one SIGTERM":
        "test_worker_failures.py::test_one_sigterm_ends_a_worker_whose_handler_left_a_thread",
    "a handler leaving a non-daemon thread, --exit-when-drained":
        "test_worker_failures.py::test_a_thread_left_by_a_handler_does_not_keep_exit_when_drained_waiting",
    "a worker whose clock jumps back an hour": _CLOCK_JUMP,
    "a worker whose clock jumps ahead an hour": _CLOCK_JUMP,
    "records with times out of every range":
        "test_hostile_records.py::test_report_counts_malformed_records_and_impossible_times",
    "qw compact on read-only files, qw status on a run/ it may not read":
        "test_readonly.py::test_compact_of_read_only_files_says_so_in_one_line",
    "tasks.log and claims.log swapped":
        "test_identity.py::test_swapped_logs_are_refused_naming_the_topic_mismatch",
    "a flipped byte in the middle of claims.log":
        "test_damage.py::test_up_refuses_a_damaged_log_before_any_worker_appends",
    "tasks.log cut short, then enqueue":
        "test_identity.py::test_a_tasks_log_cut_short_is_refused_by_enqueue_and_report",
    "another queue's claims.log in place of ours":
        "test_identity.py::test_another_queues_claims_log_is_refused_by_report_and_up",
    "another queue's tasks.log in place of ours":
        "test_identity.py::test_another_queues_tasks_log_is_refused",
    "GET /task/<5000 digits>":
        "test_bad_input.py::test_a_bad_task_id_over_http_is_a_400_that_names_it",
}  # fmt: skip


def _params() -> list[object]:
    return [
        pytest.param(a, id=a.name, marks=[pytest.mark.slow] if a.name in COVERED_BY else [])
        for a in ATTACKS
        if a.fast
    ]


@pytest.mark.parametrize("attack", _params())
def test_attack_is_held(attack: Attack, tmp_path: Path) -> None:
    finding = attack.run(tmp_path)
    assert finding.verdict is Verdict.HELD, finding.detail


def test_every_covering_test_exists() -> None:
    fast = {a.name for a in ATTACKS if a.fast}
    assert set(COVERED_BY) <= fast, set(COVERED_BY) - fast
    for attack, test in COVERED_BY.items():
        file, function = test.split("::")
        source = (TESTS / file).read_text()
        assert re.search(rf"^def {function}\(", source, re.M), f"{attack}: no {test}"
        assert not re.search(rf"@pytest\.mark\.slow\s*\ndef {function}\(", source), test
