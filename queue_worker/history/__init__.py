"""The fold checkpoint: the saved fold a starting worker or reader loads so that it replays
only the tail, on a data directory or beside a queue's Redis streams, and the compacted
prefix (what the report takes from the checkpoint instead of the removed logs).

It may import `logstore`, the root modules of `queue_worker` (topics) and
`queue_worker.protocol`; never `queue_worker.worker`, `proof`, `compaction` nor `supervisor`.
"""
