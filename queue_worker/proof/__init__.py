"""What a run proves: the report (a replay of both topics from the start through the fold),
`qw why`'s story of one task, the run in Jepsen's total-queue words, and the report's
cross-check of a Redis server's verdicts.

It may import `logstore` and what is below it in `queue_worker`: the protocol, the topics,
`queue_worker.history`, `queue_worker.worker` and `queue_worker.redis` (to read the
server's verdicts); never compaction, partitions nor `supervisor` (tests/test_layers.py).
"""
