"""What is kept of a long run: the fold checkpoint, and compaction of settled history at the
front of a file queue's logs.

It may import `logstore` and `queue_worker.protocol`; never `queue_worker.worker`,
`queue_worker.proof` nor `supervisor`.
"""
