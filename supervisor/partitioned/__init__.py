"""`qw up`, `status`, `tail`, `enqueue` and `report` on a partitioned queue, and its screens.

It may import `logstore`, `queue_worker` and the other sub-packages of `supervisor`.
"""
