"""The Redis log: one topic is one Redis stream, and the server's clock stamps every record.
Its Lua scripts are files in `lua/`, shipped as package data.

It may import `logstore`'s interface modules (base, identity, locking, location) and
redis-py; never `logstore.file`, `queue_worker` or `supervisor` (tests/test_layers.py).
"""
