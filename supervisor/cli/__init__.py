"""The `qw` command line: one typer app (`app.py`) whose commands import what they need when
they run, and the bodies and text builders of the commands that look at a queue.

It stands on top: it may import everything below it (tests/test_layers.py).
"""
