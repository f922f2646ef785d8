"""The file log: one append-only file (or a run of segment files) per topic, shared by
the processes of one machine through file locks and a small shared-memory word.

It may import `logstore`'s root modules (the interface, identity, locking) and the standard
library, msgpack and filelock; never `queue_worker` or `supervisor`, nor `logstore.redis`.
"""
