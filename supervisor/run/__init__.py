"""The running `qw up`: the supervisor and its worker slots, the fork server, the monitor
that folds the queue for the screens, pausing, signals and the run's files.

It may import `logstore`, `queue_worker` and the shared modules at the root of
`supervisor` (console, options, width, the report's texts); never the screens
(`supervisor.tui`) nor the commands (`supervisor.cli`) (tests/test_layers.py).
"""
