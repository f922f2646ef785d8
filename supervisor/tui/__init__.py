"""The live dashboard in a terminal: pure builders from a snapshot to rich renderables, and
the Live loop that draws them; the plain progress line when there is no terminal.

It may import `logstore`, `queue_worker` and `supervisor.run`'s model; never
`supervisor.cli`.
"""
