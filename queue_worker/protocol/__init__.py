"""The claims protocol as values: the records of each topic and their encoding, the fold
that alone decides who holds each task (`state.ClaimState`), and what can be named from the
records alone (clock jumps). No I/O: nothing here opens a log, a file or a socket.

It may import `logstore`'s byte-level pieces (the frame format), `queue_worker.errors` and
the small text helpers at the package root; nothing of `queue_worker`'s other sub-packages.
"""
