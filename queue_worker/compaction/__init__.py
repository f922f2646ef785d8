"""Compaction: removing the settled history at the front of a queue's logs, on the file log
(segments) and on Redis (trimmed streams and the server verdicts' state), without changing
what the report proves (the removed prefix is folded into the checkpoint first).

It may import `logstore`, the root modules of `queue_worker` (topics), `queue_worker.protocol`,
`queue_worker.history` and `queue_worker.proof` (the report's fold of a prefix); never
`queue_worker.worker`'s loop nor `supervisor`.
"""
