"""The Redis log: one topic is one Redis stream, and the server's clock stamps every record.

It may import `logstore`'s root modules and redis-py; never `queue_worker` or `supervisor`,
nor `logstore.file`.
"""
