"""The claims protocol as values: the records of each topic and their encoding, the topic
names, the fold that alone decides who holds each task (`state.ClaimState`), and what can
be named from the records alone (clock jumps). No I/O: nothing here opens a log, a file
or a socket.

It may import `logstore`'s frame format (`logstore.file.framing`, pure functions) and the
small helpers at the root of `queue_worker` (errors, times, names, values); nothing else
of `queue_worker` (tests/test_layers.py).
"""
