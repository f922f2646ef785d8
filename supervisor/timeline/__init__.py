"""`qw timeline`: a run drawn after the fact, offline, from its logs.

model   the claims log folded with the real ClaimState: lanes, bars, marks, takeovers
view    which part to draw (a window, some tasks, a readable default for large runs)
svg     the lanes as hand-written SVG          charts  the plots under them
page    one self-contained HTML file            text    the lanes in a terminal (rich)
load    reading the three topics                cli     the command

It may import `logstore`, `queue_worker` and the shared modules at the root of
`supervisor`; never `supervisor.cli` (tests/test_layers.py).
"""
