"""The names of a queue's topics: one log each (docs/protocol.md §2)."""

from __future__ import annotations

from typing import Final

TASKS_TOPIC: Final = "tasks"
CLAIMS_TOPIC: Final = "claims"
#: operator actions and worker deaths (queue_worker.ops): never read by the fold
OPS_TOPIC: Final = "ops"

#: every topic of a queue: its logs share one identity (`logstore.identity`), checked by
#: every open through `queue_worker.topics.open_topic`. Adding a topic is adding its name here.
TOPICS: Final[tuple[str, ...]] = (TASKS_TOPIC, CLAIMS_TOPIC, OPS_TOPIC)
