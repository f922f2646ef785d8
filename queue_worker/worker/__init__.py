"""One worker on the file log's protocol (docs/protocol.md §4): catch up on the topics,
pick a task, claim it and settle the claim by folding (`loop.py`); then the attempt both
workers run (`attempt.py`: the handler, the lease keeper, the time limits, DONE or FAIL)
and what they share (`base.py`, stats, the recorder, the publisher).

It may import `logstore`, `queue_worker.protocol`, the topics, `queue_worker.history` and
the producer's encoding; never `queue_worker.redis` (the server-verdict worker stands
above this package and uses its attempt), the proof, nor `supervisor` (tests/test_layers.py).
"""
