"""A Redis queue with server verdicts: the fold's rules run beside the claims stream in Lua
(`lua/`, package data), claims made in batches, and `ServerVerdictWorker`, whose tasks the
server picks and whose claims the server settles; it runs the same attempt as the file
worker (`queue_worker.worker.attempt`).

It may import `logstore` (its Redis backend too), `queue_worker.protocol`, the topics,
`queue_worker.history` and `queue_worker.worker`; never the proof, compaction,
partitions nor `supervisor` (tests/test_layers.py).
"""
