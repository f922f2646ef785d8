"""Compaction: removing the settled history at the front of a queue's logs, on the file log
(segments) and on Redis (trimmed streams and the server verdicts' state), without changing
what the report proves (the removed prefix is folded into the checkpoint first, with the
report's own replay).

It may import `logstore`, `queue_worker.protocol`, the topics, `queue_worker.history` and
`queue_worker.proof`; never partitions nor `supervisor` (tests/test_layers.py).
"""
