"""The file log: one append-only file (or a run of segment files) per topic, shared by the
processes of one machine through file locks and a small shared-memory word.

It may import `logstore`'s interface modules (base, identity, locking, location) and the
standard library, msgpack and filelock; never `logstore.redis`, `queue_worker` or
`supervisor` (tests/test_layers.py).
"""
