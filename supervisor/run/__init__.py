"""The running `qw up`: the supervisor and its worker slots, the fork server, the monitor
that folds the queue for the screens, pausing and signals.

It may import `logstore` and `queue_worker`; of `supervisor`, only `supervisor.tui`'s
progress line. Never `supervisor.cli`.
"""
