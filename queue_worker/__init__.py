"""queue_worker — the claims protocol: records, the pure verdict, the worker loop, the report."""
