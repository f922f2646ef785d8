"""`qw up` on a partitioned queue: the supervisor's workers split over the partitions (or
member processes that follow membership), and the screens and stats endpoint of that run.
Its commands (`status`, `tail`, `report`, …) are in `supervisor.cli`.

It may import `logstore`, `queue_worker`, the shared modules at the root of `supervisor`,
`supervisor.run` and `supervisor.tui`; never `supervisor.cli` (tests/test_layers.py).
"""
