"""The variants of a parametrized test that `make test` leaves to `make test-all`.

`make test` is the fast tier (tests marked `slow` are left out). A test marked slow where
it stands is one whose path another fast test walks (its decorator says which). A
parametrized test is often the same path run several ways: every command, both verdict
modes of a Redis queue, each log of a pair. The fast tier runs the variants that walk the
path (the most used commands, the default verdict mode, one log of the pair) and
`SLOW_VARIANTS` names the others; `mark_slow_variants` marks them slow at collection, and
refuses a name that no longer matches a test, so the list cannot drift from the tests.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

#: Redis tests run with both verdict modes: the fast tier runs the default, server verdicts
#: (client verdicts keep tests of their own in test_verdict_mode and test_redis_e2e)
CLIENT = ("client",)
#: a command run piped, with COLUMNS and without: the fast tier reads the main readers at 80
WIDTH_SLOW = (
    "tail --topic tasks-no COLUMNS", "tail --topic tasks-COLUMNS=80", "tail-no COLUMNS",
    "why 35-COLUMNS=80", "why 35-no COLUMNS", "timeline --text-no COLUMNS", "report-no COLUMNS",
    "task 0-no COLUMNS", "task 35-no COLUMNS", "task 35-COLUMNS=80", "why 0-no COLUMNS",
)  # fmt: skip

SLOW_VARIANTS: dict[str, Sequence[str]] = {
    "test_redis_lost_history.py::test_the_report_says_what_it_verified": CLIENT,
    "test_redis_lost_history.py::test_up_stops_on_a_stream_trimmed_mid_run": CLIENT,
    "test_redis_lost_history.py::test_report_refuses_a_tasks_stream_trimmed_mid_id": CLIENT,
    "test_redis_lost_history.py::test_report_refuses_a_claims_stream_trimmed_by_hand": CLIENT,
    "test_redis_lost_history.py::test_up_refuses_a_trimmed_stream_before_any_worker_appends":
        CLIENT,
    "test_redis_lost_history.py::test_flushall_mid_run_stops_every_worker_before_it_appends":
        CLIENT,
    "test_redis_jobs.py::test_the_server_picks_by_priority_and_never_before_a_delay_s_end": CLIENT,
    "test_server_claim_processes.py::"
    "test_a_drain_with_server_verdicts_folds_no_claims_record_in_any_worker": CLIENT,
    "test_verdict_mode.py::"
    "test_each_partition_of_a_new_partitioned_queue_records_the_mode_and_follows_it":
        ("&verdicts=client-client",),
    "test_width.py::test_every_line_fits_80_columns_piped": WIDTH_SLOW,
    "test_width.py::test_a_partitioned_queue_fits_80_columns_piped":
        ("report", "timeline --text", "tail", "task 1:2"),
    "test_width.py::test_qw_up_without_a_terminal_fits_80_columns": ("no COLUMNS",),
    # hostile records before every reader: the fast tier runs report, why, status and a JSON
    "test_hostile_records.py::test_no_reader_crashes_on_hostile_records":
        ("report --json", "tail", "why 1", "task 3", "task 0", "tail --topic tasks", "status"),
    "test_hostile_records.py::test_text_output_names_workers_by_label": ("tail", "task 0"),
    "test_hostile_records.py::test_a_worker_name_with_escapes_is_printed_escaped":
        ("task 1", "why 1"),
    "test_hostile_records.py::test_an_impossible_time_is_shown_as_its_number":
        ("why 0", "tail", "task 0"),
    "test_help.py::test_help_reads_whole_at_80_columns": (
        "demo skew", "demo pause", "demo redistribution", "demo collisions", "task", "tail",
        "kill", "compact", "retry", "cancel", "replay", "timeline",
    ),
    "test_startup_imports.py::test_the_qw_script_runs_the_small_commands_on_what_they_use": (
        "args1-absent1", "args2-absent2", "args3-absent3", "args4-absent4", "args5-absent5",
    ),
    "test_startup_imports.py::test_a_reader_of_an_existing_queue_does_not_import_filelock":
        ("args1", "args2", "args3"),
    "test_partition_layout.py::test_an_empty_data_directory_is_refused": ("-d ''", "--dir="),
    # damage to either log: the fast tier damages one (the cut rule is one for both)
    "test_damage.py::test_up_refuses_a_damaged_log_before_any_worker_appends": ("claims",),
    "test_damage.py::test_damage_met_at_run_time_stops_the_run_in_one_line": ("claims",),
    "test_cut_rule.py::test_a_sealed_segment_cut_short_is_refused_naming_the_file_and_both_lengths":
        ("tasks",),
    "test_readonly.py::test_looking_at_a_read_only_archive_works_and_writes_nothing":
        ("logs-only",),
    "test_poison.py::test_a_task_that_kills_its_worker_goes_dead_after_max_attempts":
        ("segfaults-killed by SIGSEGV",),
    "test_watchdog.py::test_sigterm_drains_a_handler_that_ignores_cancellation":
        ("args1-timed out after 3 s",),
    "test_worker_failures.py::"
    "test_a_result_over_the_record_limit_is_a_fail_naming_the_limit_and_the_size":
        ("200MB-string",),
    # a kill -9 at each step of a Redis trim: test_redis_compaction's steps; the verdicts'
    # own trim at one step here
    "test_redis_verdict_trim.py::"
    "test_kill_9_at_every_step_leaves_the_verdicts_and_the_fold_agreeing":
        ("dropped", "folded", "locked"),
    "test_partition_compaction.py::test_a_partitioned_qw_up_compacts_each_partition_on_redis":
        ("partitions", "rebalance"),
    "test_partition_compaction.py::"
    "test_a_partitioned_qw_up_compacts_each_partition_on_the_file_log": ("rebalance",),
    "test_checkpoint_recover.py::"
    "test_a_damaged_checkpoint_is_refused_naming_the_command_that_puts_the_previous_back":
        ("a worker's save",),
    "test_demo_traffic.py::test_demo_and_rate_add_demo_tasks_and_say_so":
        ("args1-publishing 3 demo tasks/s",),
}  # fmt: skip


def mark_slow_variants(items: Sequence[pytest.Item]) -> None:
    """Mark slow the variants `SLOW_VARIANTS` names; a name matching no collected test is
    an error (when that test's file was collected at all)."""
    wanted = {(test, variant) for test, variants in SLOW_VARIANTS.items() for variant in variants}
    files = set()
    for item in items:
        file = item.nodeid.split("::")[0].removeprefix("tests/")
        files.add(file)
        function, _, variant = item.nodeid.split("::", 1)[1].partition("[")
        key = (f"{file}::{function}", variant.removesuffix("]"))
        if key in wanted:
            item.add_marker(pytest.mark.slow)
            wanted.discard(key)
    missing = sorted(f"{t}[{v}]" for t, v in wanted if t.split("::")[0] in files)
    if missing:
        raise pytest.UsageError(f"tests/tiers.py names variants no test has: {missing}")
