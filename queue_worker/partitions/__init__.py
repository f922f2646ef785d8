"""A partitioned queue: P sub-queues, each with its own topics and total order; creating
and finding one, enqueueing into it, membership (which worker processes work which
partitions), and the whole queue's report. The manifest's layout itself is
`queue_worker.partition_layout`, below the topics.

It may import everything else of `queue_worker` but its face, and `logstore`; never
`supervisor` (tests/test_layers.py).
"""
