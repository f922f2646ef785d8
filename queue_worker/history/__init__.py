"""The fold checkpoint: the saved fold a starting worker or reader loads so that it replays
only the tail, in a data directory or beside a queue's Redis streams, and the compacted
prefix (what the report takes from the checkpoint instead of the removed logs).

It may import `logstore`, `queue_worker.protocol` and the topics (`queue_worker.topics`);
never the worker, the proof, compaction nor `supervisor` (tests/test_layers.py).
"""
