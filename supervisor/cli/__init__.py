"""The `qw` command line: one typer app (`app.py`) whose commands import what they need when
they run, and the pure text builders of the commands that look at a queue.

It may import everything below it: `logstore`, `queue_worker` and the other sub-packages
of `supervisor`.
"""
