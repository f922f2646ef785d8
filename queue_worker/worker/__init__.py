"""One worker process: catching up on the topics, picking a task, claiming it, keeping its
lease while the handler runs, and publishing what it has done. `loop.Worker` folds the
claims log itself; `attempt` runs one attempt for it and for the server-verdict worker
(`queue_worker.redis.server_worker`); `opening.open_worker` chooses between them.

It may import `logstore`, `queue_worker.protocol` and `queue_worker.history` (to start from
a fold checkpoint); the Redis server-verdict path is imported only on a Redis queue with
server verdicts. Never `queue_worker.proof` nor `supervisor`.
"""
