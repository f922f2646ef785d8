"""`qw replay`: a recorded run as a tape, played forwards and back in a terminal.

rules   the rules a replay folds by: qw's own (ClaimState and `qw why`'s words), and what
        another set must provide to be played the same way
tape    reading a run: the claims records (the tape), the ops records on it, the tasks
model   the stepping engine: the fold at any position, with snapshots (no terminal)
view    the screen at one position, as rich text or as plain lines
player  the keys and the loop on the terminal
cli     the command

It may import `logstore`, `queue_worker`, the shared modules at the root of `supervisor`,
`supervisor.tui` and `supervisor.timeline`; never `supervisor.cli` (tests/test_layers.py).
"""
