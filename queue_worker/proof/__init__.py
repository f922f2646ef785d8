"""What a run proves: the report (a replay of both logs from the start), `qw why`'s story of
one task, and the run in Jepsen's total-queue words.

It may import `logstore`, `queue_worker.protocol` and `queue_worker.history` (the
compacted prefix); never `queue_worker.worker` nor `supervisor`.
"""
