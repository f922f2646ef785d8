"""supervisor — the application: forks and watches workers, the dashboard, the `qw` CLI.

It stands on `logstore` and `queue_worker`; its own layers are drawn in
docs/architecture.md and held by tests/test_layers.py.
"""
