"""A Redis queue with server verdicts: the fold's rules run beside the claims stream in Lua,
batches of claims, the worker that claims through them (`server_worker`), and what
compaction does to the server's state.

It may import `logstore` (its Redis backend too), `queue_worker.protocol`,
`queue_worker.history` and the worker's shared pieces; never `queue_worker.proof`'s report
nor `supervisor`.
"""
