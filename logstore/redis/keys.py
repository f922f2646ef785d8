"""The names of the Redis keys qw uses (one function, so that a deployment that needs other
names changes one place): `logstore.redis.log` and its helpers build every key with it."""

from __future__ import annotations


def redis_key(prefix: str, name: str, *parts: str) -> str:
    """The name of every Redis key qw uses, built here and nowhere else (a deployment that
    needs other names, such as Redis Cluster hash tags, changes this one function).

    ``redis_key(prefix, topic)`` is a topic's stream, ``redis_key(prefix, "queue")`` the
    queue's identity, ``redis_key(prefix, topic, *parts)`` a key that belongs to a topic's
    stream (an append's retry record, the protocol's state kept beside the claims stream):
    ``qw:<name>[:<part>…]``, after ``<prefix>:`` when there is a prefix. Scripts get every
    key they touch as KEYS[], never build one."""
    key = ":".join(("qw", name, *parts))
    return f"{prefix}:{key}" if prefix else key
