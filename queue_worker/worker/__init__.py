"""One worker process: catching up on the topics, picking a task, claiming it, keeping its
lease while the handler runs, and publishing what it has done.

It may import `logstore`, `queue_worker.protocol` and `queue_worker.history` (to start from
a fold checkpoint); the Redis server-verdict path is imported only on a Redis queue with
server verdicts. Never `queue_worker.proof` nor `supervisor`.
"""
