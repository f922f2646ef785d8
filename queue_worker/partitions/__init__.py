"""A partitioned queue: P sub-queues, each with its own topics and total order, their
layout, membership, and the whole queue's report.

It may import every other sub-package of `queue_worker` and `logstore`; never `supervisor`.
"""
