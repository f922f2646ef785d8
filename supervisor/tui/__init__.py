"""The live dashboard in a terminal: pure builders from a snapshot to rich renderables, and
the Live loop that draws them; the plain progress line when there is no terminal.

It may import `logstore`, `queue_worker`, the shared modules at the root of `supervisor`
and `supervisor.run` (its model); never the commands (`supervisor.cli`)
(tests/test_layers.py).
"""
