"""The Redis log: one topic is one Redis stream, and the server's clock stamps every record.

A topic is the stream at key ``qw:<topic>`` in the database the URL names (every key name
is built by `redis_key`, and every script is given its keys as KEYS[]). Each record is
one stream entry with a single field ``d`` holding its bytes. Open one with
``RedisLog.open(url, topic)`` (or ``logstore.open_log(url, topic)``).

The URL is redis-py's (``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` for
TLS, ``unix:///path/to.sock?db=0``), with these query parameters of our own:

``prefix=P``        the stream key becomes ``P:qw:<topic>`` — several independent queues (or
                    test runs) in one database.
``retries=N``       how many times one call retries after a connection error or timeout,
                    with exponential backoff (0.1 s doubling up to 2 s; default 5, so a call
                    gives up after about 3 s of not reaching the server).
``max_record=B``    the largest record in bytes (default 16 MiB).
``socket_timeout=S`` (redis-py's own) seconds to wait for a reply (default 5).
``verdicts=M``      the queue's verdict mode, ``server`` (workers claim through the
                    server's copy of the rules, queue_worker.redis.server_claim) or ``client``:
                    chosen when the queue is created (default ``server``) and recorded in
                    it; on an existing queue it may only repeat it (logstore.redis.verdict_mode).

Positions
---------
A stream entry id is ``<ms>-<seq>``: the server's clock in milliseconds when the entry was
added, and a sequence number within that millisecond. A position packs the id into one
integer, ``(ms << 20) | seq``. The packing is order-preserving, and ``Entry.next`` is simply
``position + 1``: unpacked, that is ``ms-(seq+1)`` (or ``(ms+1)-0`` when seq is the largest
the packing holds), the least id after the entry, and reading is inclusive (``XRANGE`` from
that id), so a reader resumes exactly after what it has read. ``start`` is 0 (the id
``0-0``, which no entry can have). A sequence of 2^20 or more within one millisecond cannot
be packed: an append that would produce one is undone and raises ``AppendError``; it needs
over a million appends in one millisecond of the server's clock (or a server clock that
stood still while they were made). Packed positions fit in 63 bits until the year 2248.

``Entry.server_time_us`` is ``ms * 1000``: the server's clock at the append, the single
clock by which the protocol judges leases on this backend. Redis never lets ids go back:
if the server's clock steps back, new entries keep the last millisecond (and count up seq).

Appends
-------
``append`` and ``append_many`` run one Lua script: every record of a call is added in one
step on the server, so a batch is contiguous (no other writer's entry between them) and all
or nothing (if any ``XADD`` fails, the ones already added are deleted before the error
returns; the stream's last id stays where it was, which only means the next id is larger).

An append is retried after a connection error, so it must not be added twice when the
first attempt reached the server but its reply was lost. Each call carries a number unique
to this handle (and process), and the script keeps the last call's number and its first and
last ids in ``<stream key>:w:<handle id>`` (expiring 10 minutes after the last append, and
deleted by ``close()``): a retry of a call the server has already done returns the ids it
got the first time and adds nothing. What this cannot settle: when every retry fails, the
outcome is unknown if an attempt failed after sending (a lost connection or a timeout, not a
refused connection): ``AppendError`` is raised, its message then says that the append may
still have been made, and its records may be in the log.

``append_and_read`` is an append whose script also returns the entries from a given
position through the records it added (at most a given count): a worker settles its own
records with the append's one round trip instead of an append and a read.

Reading and waiting
-------------------
``read`` is a script that runs ``XRANGE key <id> + COUNT n`` on the server and answers the
entries as one string (a header of ids and lengths, then the records' bytes), which costs
about a tenth of XRANGE's nested reply to parse here; where the server refuses scripts (an
ACL user without EVALSHA) it is XRANGE itself. The scripts are called on a connection the
handle holds, packed by this module (`_run_script`): redis-py's client machinery cost as
much CPU per call as the round trip.

``wait`` is ``XREAD BLOCK`` for an entry after the id just before the position, on a
connection of its own (a blocked read never holds a connection another call needs), in
blocks of at most 5 s; ``timeout=0`` checks without blocking. Blocking is rounded up to
whole milliseconds (at least 1 ms).

Connections and errors
----------------------
Connection errors and timeouts are retried (see ``retries``); redis-py's own retries are
turned off so that there is one predictable layer. After that the call raises
``AppendError`` (appends) or ``LogError`` (everything else) with a message such as
``cannot reach redis at redis://127.0.0.1:6390/0: Connection refused``; any other error
from the server (out of memory, wrong key type, no permission) is a ``LogError`` naming
the URL too. The password in a URL never appears in a message. A handle whose connection
was lost reconnects on its next call, and since positions are the server's ids, a reader
resumes from its position after a restart without reading anything twice (as long as the
server kept its data: run it with ``appendonly yes``).

Durability
----------
Nothing is forced from the client. What survives is the server's AOF policy:
``appendonly yes`` with ``appendfsync always`` survives a power cut for every append that
returned; ``appendfsync everysec`` (Redis's default) may lose the last second of appends;
without AOF or RDB everything is lost with the server process. So ``Durability`` and the
``durable`` flag change nothing here: ``COMMIT`` and ``ALWAYS`` both mean "configure
``appendfsync always``", ``NONE`` means ``everysec`` or less. (A server of 7.2 or later
could confirm an fsync per append with ``WAITAOF``; this backend does not issue it.)

One handle is for one thread at a time; each process opens its own (the connection pools
notice a fork and reconnect).

Redis Cluster
-------------
``cluster=yes`` in the URL makes the handle a ``redis.cluster.RedisCluster`` client: the
URL names any node, the client finds the others and sends each command to the node that
owns its key's slot. Every call of a handle touches its stream, its last-append record
(``<stream key>:w:…``), its start and removed count (``<stream key>:start``, ``:removed``)
and the identity key (``qw:queue``, checked by every script: ``QUEUE_LUA``; at open also
the verdict mode ``qw:queue:verdicts``): they must share a slot, which
a hash tag in ``prefix`` gives them (``prefix={p3}``: the keys ``{p3}:qw:claims``,
``{p3}:qw:claims:w:…`` and ``{p3}:qw:queue`` hash on ``p3`` alone). A partitioned queue
(`queue_worker.partition_layout`) gives each partition such a prefix. A cluster has database 0
only. While a node is down, the calls for its slots are retried as connection errors are.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import time
import uuid
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Final, TypeVar, cast
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

try:
    import redis
    import redis.exceptions as rex
    from redis.backoff import ExponentialBackoff, NoBackoff
    from redis.commands.core import Script
    from redis.retry import Retry
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("the Redis log needs the 'redis' package: pip install 'qw[redis]'") from exc

from logstore.base import (
    AppendError,
    CorruptLogError,
    Durability,
    Entry,
    ForeignFileError,
    Log,
    LogClosedError,
    LogError,
    PositionCompactedError,
    RecordTooLargeError,
)
from logstore.identity import (
    QUEUE_ID_SIZE,
    IdentityError,
    LogIdentity,
    LostHistoryError,
    new_queue_id,
)
from logstore.location import redact_url as _redact
from logstore.redis import verdict_mode
from logstore.redis.keys import redis_key
from logstore.redis.scripts import lua_file

__all__ = [
    "DEFAULT_MAX_RECORD",
    "redis_key",
    "SEQ_BITS",
    "RedisLog",
    "after_id",
    "format_id",
    "pack_id",
    "parse_id",
    "unpack_position",
]

T = TypeVar("T")

DEFAULT_MAX_RECORD = 16 * 1024 * 1024
#: a batch (one script call) larger than this is refused before it is sent
MAX_BATCH_BYTES = 256 * 1024 * 1024
DEFAULT_RETRIES = 5
DEFAULT_SOCKET_TIMEOUT = 5.0
DEFAULT_CONNECT_TIMEOUT = 5.0
#: the longest single XREAD BLOCK; a longer wait blocks again
BLOCK_CHUNK_S = 5.0
#: entries the start-up check looks at in one script call (`RedisLog.check`)
CHECK_BATCH = 4096
#: the COUNT of a read that wants every entry (a script takes a number, not "no limit")
READ_ALL = 1 << 62
#: how long the server keeps a handle's last-append record (for retries of that append)
DEDUP_TTL_MS = 10 * 60 * 1000

SEQ_BITS = 20
SEQ_LIMIT = 1 << SEQ_BITS
_SEQ_MASK = SEQ_LIMIT - 1
_U64_MAX = (1 << 64) - 1
_tuple_new = cast("Callable[[type[Entry], tuple[int, int, bytes, int]], Entry]", tuple.__new__)

# URL query parameters this module takes (or overrides) rather than passing to redis-py.
_OWN_PARAMS = ("prefix", "retries", "max_record", "cluster", "verdicts")
_FORCED_PARAMS = ("socket_timeout", "decode_responses", "protocol")

# The scripts of a handle (logstore/redis/lua/, `logstore.redis.scripts`): each file says what
# it takes and answers. The shared functions first: every script that reads or appends checks
# the queue identity (queue_refused), a read's first id against the stream's start
# (trimmed_before), and answers entries as one string (entries, parsed by `_parse_entries`).
_PACKAGE: Final = "logstore.redis"
_ENTRIES_LUA: Final = lua_file(_PACKAGE, "entries.lua")
QUEUE_LUA: Final = lua_file(_PACKAGE, "queue_refused.lua")
TRIMMED_LUA: Final = lua_file(_PACKAGE, "trimmed_before.lua")
COUNTS_LUA: Final = lua_file(_PACKAGE, "entry_counts.lua")
_READ_LUA: Final = _ENTRIES_LUA + TRIMMED_LUA + QUEUE_LUA + lua_file(_PACKAGE, "read.lua")
_CHECK_LUA: Final = TRIMMED_LUA + QUEUE_LUA + lua_file(_PACKAGE, "check.lua")
_APPEND_LUA: Final = _ENTRIES_LUA + TRIMMED_LUA + QUEUE_LUA + lua_file(_PACKAGE, "append.lua")
_HISTORY_LUA: Final = COUNTS_LUA + lua_file(_PACKAGE, "history.lua")

#: the error a read script answers for a position before the stream's start
TRIMMED_ERROR: Final = "QWTRIMMED"
#: the error every script of a handle answers when the queue identity is not its queue's
QUEUE_ERROR: Final = "QWQUEUE"


# -- key names -------------------------------------------------------------------------


# -- ids and positions ---------------------------------------------------------------


def pack_id(ms: int, seq: int) -> int:
    """The position of the stream entry id ``ms-seq``."""
    if ms < 0 or seq < 0:
        raise ValueError(f"stream id {ms}-{seq} is negative")
    if seq >= SEQ_LIMIT:
        raise LogError(
            f"stream entry id {ms}-{seq} cannot be a position: its sequence number is "
            f"{SEQ_LIMIT} or more (more entries in one millisecond than qw packs)"
        )
    return (ms << SEQ_BITS) | seq


def unpack_position(position: int) -> tuple[int, int]:
    """The stream id ``(ms, seq)`` a position stands for (the least id at or after it)."""
    if position < 0:
        raise ValueError(f"position {position} is negative; expected 0 or more")
    return position >> SEQ_BITS, position & _SEQ_MASK


def format_id(ms: int, seq: int) -> str:
    return f"{ms}-{seq}"


def parse_id(raw: bytes | str) -> tuple[int, int]:
    """``b"1700000000000-3"`` → ``(1700000000000, 3)``."""
    text = raw.decode("ascii") if isinstance(raw, bytes) else raw
    ms_text, sep, seq_text = text.partition("-")
    if not sep or not ms_text.isdigit() or not seq_text.isdigit():
        raise LogError(f"not a stream entry id: {text!r}")
    return int(ms_text), int(seq_text)


def after_id(position: int) -> str:
    """The id to give XREAD (which returns entries *after* an id) so that it returns the
    entries at or after `position`: the greatest id before the position's own id."""
    ms, seq = unpack_position(position)
    if seq > 0:
        return format_id(ms, seq - 1)
    if ms > 0:
        return format_id(ms - 1, _U64_MAX)
    return "0-0"  # position 0: no entry can have the id 0-0


# -- the URL -------------------------------------------------------------------------


class _Settings:
    """What `RedisLog` reads from a URL: redis-py's URL without our parameters, and ours."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        query = parse_qsl(parts.query, keep_blank_values=True)
        own = {k: v for k, v in query if k in _OWN_PARAMS or k in _FORCED_PARAMS}
        rest = [(k, v) for k, v in query if k not in own]
        self.redis_url = urlunsplit(parts._replace(query=urlencode(rest)))
        self.display_url = _redact(url)
        self.prefix = own.get("prefix", "")
        cluster = own.get("cluster", "no")
        if cluster not in ("yes", "no"):
            raise ValueError(f"cluster={cluster!r} in {self.display_url}: expected yes or no")
        self.cluster = cluster == "yes"
        #: who computes the verdicts, as the URL asks (None: as the queue was created;
        #: see logstore.redis.verdict_mode); a log of bytes only keeps the word
        self.verdicts = own.get("verdicts")
        if self.verdicts is not None and self.verdicts not in ("client", "server"):
            raise ValueError(
                f"verdicts={self.verdicts!r} in {self.display_url}: expected client or server"
            )
        self.retries = _int_param(own, "retries", DEFAULT_RETRIES, url)
        self.max_record = _int_param(own, "max_record", DEFAULT_MAX_RECORD, url)
        self.socket_timeout = DEFAULT_SOCKET_TIMEOUT
        if "socket_timeout" in own:
            try:
                self.socket_timeout = float(own["socket_timeout"])
            except ValueError:
                raise ValueError(
                    f"socket_timeout={own['socket_timeout']!r} in {self.display_url} is not "
                    "a number of seconds"
                ) from None
        if self.retries < 0 or self.max_record < 1 or self.socket_timeout <= 0:
            raise ValueError(f"out-of-range parameter in {self.display_url}")


def _int_param(params: dict[str, str], key: str, default: int, url: str) -> int:
    if key not in params:
        return default
    try:
        return int(params[key])
    except ValueError:
        raise ValueError(f"{key}={params[key]!r} in {_redact(url)} is not an integer") from None


def _reason(exc: BaseException) -> str:
    """The root cause of a connection error in a few words ("Connection refused")."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and not isinstance(cur, rex.RedisError) and cur.strerror:
            return cur.strerror
        cur = cur.__cause__ or cur.__context__
    text = str(exc).strip() or type(exc).__name__
    return text.rstrip(".")


def _before_sending(exc: Exception) -> bool:
    """Whether `exc` failed to connect (so the command certainly never reached the server),
    as opposed to losing a connection, or timing out, after sending it."""
    text = str(exc)
    return "connecting to" in text or "Timeout connecting" in text


def _own_refusal(exc: rex.ResponseError) -> bool:
    """An error a read script answers on purpose (or a key that is not a stream), as
    opposed to a server that refuses scripts altogether."""
    text = str(exc)
    return "WRONGTYPE" in text or TRIMMED_ERROR in text or text.startswith(QUEUE_ERROR)


def _retryable(exc: Exception) -> bool:
    # wrong credentials or permissions do not get better by asking again
    return not isinstance(exc, (rex.AuthenticationError, rex.AuthorizationError))


# -- the log -------------------------------------------------------------------------


class RedisLog(Log):
    """One Redis stream as a `Log`. See the module docstring for the details."""

    def __init__(
        self,
        url: str,
        topic: str,
        *,
        durability: Durability | None = None,
        max_record: int | None = None,
        retries: int | None = None,
    ) -> None:
        if not topic:
            raise ValueError("a topic name must not be empty")
        settings = _Settings(url)
        self.url = settings.display_url
        self.prefix = settings.prefix
        #: the URL's ``verdicts=`` (None when it has none)
        self.asked_verdicts = settings.verdicts
        #: the queue's verdict mode (logstore.redis.verdict_mode): resolved from the queue by an
        #: open with a family; a handle that looks at no queue has the URL's word, or client
        self.verdicts = settings.verdicts or "client"
        self.key = redis_key(settings.prefix, topic)
        #: the queue's identity (`logstore.identity`): 16 random bytes, set with its first log
        self.id_key = redis_key(settings.prefix, "queue")
        #: where the stream starts once compaction trimmed it (logstore.redis.trim)
        self.start_key = redis_key(settings.prefix, topic, "start")
        #: how many entries qw removed from the stream (compaction's trims, appends
        #: undone), counted by the script that removes them (`verify_history`)
        self.removed_key = redis_key(settings.prefix, topic, "removed")
        #: the queue and topic this handle was opened as (None: opened without a family)
        self.identity: LogIdentity | None = None
        #: opened for reading only (`open(read_only=True)`): appends raise LogError
        self.read_only = False
        self.name = f"{self.url} {self.key}"
        self.topic = topic
        #: kept for symmetry with the file log: on Redis the server's AOF policy decides
        self.durability = durability
        self.max_record = max_record if max_record is not None else settings.max_record
        self._retry = Retry(
            ExponentialBackoff(cap=2.0, base=0.05),
            retries if retries is not None else settings.retries,
            supported_errors=_UNREACHABLE,
        )
        common: dict[str, object] = {
            "decode_responses": False,
            "protocol": 2,
            "socket_connect_timeout": DEFAULT_CONNECT_TIMEOUT,
            "socket_keepalive": True,
            "retry": Retry(NoBackoff(), 0),  # ours is the one retry layer
            # redis-py reconnects a dropped connection by itself, silently: every new
            # connection checks the queue identity before it is used (see _on_connect)
            "redis_connect_func": self._on_connect,
            **_driver_kwargs(),
        }
        make = redis.Redis.from_url
        self._clustered = settings.cluster
        if settings.cluster:
            make = _cluster_client
            # RedisCluster makes the handshake itself before it calls ours
            common["redis_connect_func"] = partial(self._on_connect, handshake=False)
        try:
            self._client = make(
                settings.redis_url, socket_timeout=settings.socket_timeout, **common
            )
            # XREAD BLOCK holds its connection for up to BLOCK_CHUNK_S: a pool of its own
            self._blocking = make(
                settings.redis_url,
                socket_timeout=settings.socket_timeout + BLOCK_CHUNK_S,
                **common,
            )
        except (ValueError, rex.RedisClusterException) as exc:
            raise ValueError(f"bad redis URL {self.url}: {exc}") from None
        self._script = self._client.register_script(_APPEND_LUA)
        self._read_script = self._client.register_script(_READ_LUA)
        self._check_script = self._client.register_script(_CHECK_LUA)
        self._history_script = self._client.register_script(_HISTORY_LUA)
        #: the connection the scripts are called on (`_run_script`), and the pid it is for
        self._conn: redis.connection.Connection | None = None
        self._conn_pid = -1
        #: reads go through `_READ_LUA` until the server refuses scripts (an ACL without
        #: EVALSHA): then XRANGE, whose reply costs more to parse
        self._script_reads = True
        self._writer_pid = -1
        self._writer_key = ""
        self._calls = itertools.count(1)
        self._closed = False

    @classmethod
    def open(
        cls,
        url: str,
        topic: str,
        *,
        durability: Durability | None = None,
        max_record: int | None = None,
        retries: int | None = None,
        family: Sequence[str] = (),
        read_only: bool = False,
        create: bool = True,
    ) -> RedisLog:
        """Open the log of `topic` at `url`, checking that the server answers and that the
        key is a stream (or absent: the first append creates it).

        With a `family` (the queue's topics), the queue's identity key is read (and set, if
        no stream of the family holds anything yet and not `read_only`); streams without
        it are refused. The handle then checks the key again after every reconnection and
        every idle wait: a server reset under a running worker (restarted without
        persistence, flushed) raises IdentityError instead of mixing two queues' records.
        `create=False`: the queue exists already (a process of its run opens one more of
        its topics): an identity gone is a reset, IdentityError, and nothing is created."""
        log = cls(url, topic, durability=durability, max_record=max_record, retries=retries)
        try:
            kind = log._call("open", lambda: _text(log._client.type(log.key)))
            if kind not in ("none", "stream"):
                raise ForeignFileError(
                    f"{log.name}: the key holds a Redis {kind}, not a stream; it is not a "
                    "qw log (choose another topic or a ?prefix=)"
                )
            log.read_only = read_only
            if family:
                log._adopt_identity(family, read_only, create)
        except BaseException:
            log.close()
            raise
        return log

    def _adopt_identity(self, family: Sequence[str], read_only: bool, create: bool) -> None:
        """Read the queue's identity and verdict mode (creating both, unless `read_only`,
        for a queue not created yet: `logstore.redis.verdict_mode`)."""
        client = self._client
        asked = self.asked_verdicts
        queue, self.verdicts = verdict_mode.resolve(self, family, asked, None)
        if queue is None:
            keys = [redis_key(self.prefix, t) for t in family]
            used = [k for k in keys if self._call("look at", partial(client.xlen, k))]
            if used:
                raise IdentityError(
                    f"{self.url}: the streams {', '.join(used)} hold records but the queue "
                    f"identity {self.id_key} is missing: the server lost part of its data, "
                    "or they were written by an older qw"
                )
            if read_only:
                return
            if not create:
                raise IdentityError(
                    f"{self.url}: the queue identity {self.id_key} is missing: the server "
                    "was reset (restarted without persistence, or flushed) under the queue's "
                    "run; nothing is created in its place"
                )
            queue, self.verdicts = verdict_mode.resolve(self, family, asked, new_queue_id())
        if not isinstance(queue, bytes) or len(queue) != QUEUE_ID_SIZE:
            raise IdentityError(f"{self.url}: {self.id_key} is not a qw queue identity")
        self.identity = LogIdentity(queue, self.topic)

    def _on_connect(
        self, connection: redis.connection.AbstractConnection, *, handshake: bool = True
    ) -> None:
        """A new connection: once this handle knows its queue, the server must still hold
        it. A server restarted without persistence (or flushed) has lost it: refuse the
        connection before any command runs on it, so that no record of the old fold goes
        to the new server and no record of the new server is folded into the old fold."""
        if handshake:
            connection.on_connect()  # type: ignore[no-untyped-call]
        identity = self.identity
        if identity is None:
            return
        connection.send_command("GET", self.id_key)  # type: ignore[no-untyped-call]
        try:
            found = connection.read_response()
        except rex.MovedError:  # a cluster node that does not own our slot: its owner checks
            return
        if found != identity.queue:
            connection.disconnect()  # type: ignore[no-untyped-call]
            raise self._reset_error(missing=found is None)

    def _reset_error(self, *, missing: bool) -> IdentityError:
        what = "is missing" if missing else "has changed"
        return IdentityError(
            f"{self.name}: the queue identity {self.id_key} {what}: the server was reset "
            "(restarted without persistence, or flushed) since this log was opened, and "
            "what this process read of the queue is gone; start again"
        )

    def _check_identity(self) -> None:
        """Raise IdentityError when the queue identity on the server is not ours any more."""
        identity = self.identity
        if identity is None:
            return
        found = self._client.get(self.id_key)
        if found != identity.queue:
            raise self._reset_error(missing=found is None)

    @property
    def _queue_arg(self) -> bytes:
        """What the scripts check the identity key against (QUEUE_LUA): b'' for a handle
        opened without its queue (nothing to check)."""
        return b"" if self.identity is None else self.identity.queue

    # -- plumbing

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError(f"{self.name} is closed")

    def _call(self, what: str, fn: Callable[[], T], error: type[LogError] = LogError) -> T:
        """Run `fn` with retries; turn what redis raises into `error` with a clear message."""
        self._check_open()
        failures: list[Exception] = []

        def attempt() -> T:
            if failures:  # reconnecting: the server may have been reset meanwhile
                self._check_identity()
            return fn()

        try:
            return self._retry.call_with_retry(attempt, failures.append, is_retryable=_retryable)
        except _UNREACHABLE as exc:
            tried = f", {len(failures)} attempts" if len(failures) > 1 else ""
            message = f"cannot reach redis at {self.url}: {_reason(exc)} ({what} {self.key}{tried})"
            if error is AppendError and not all(map(_before_sending, failures or [exc])):
                message += "; the append may still have been made (a reply was lost)"
            raise error(message) from exc
        except rex.RedisError as exc:
            if str(exc).startswith(QUEUE_ERROR):  # a script's refusal (QUEUE_LUA)
                raise self._reset_error(missing=str(exc).endswith("missing")) from None
            raise error(f"redis at {self.url} refused {what} {self.key}: {exc}") from exc

    def _writer(self) -> str:
        """This handle's last-append key; a forked child gets its own."""
        pid = os.getpid()
        if pid != self._writer_pid:
            self._writer_pid = pid
            self._writer_key = redis_key(self.prefix, self.topic, "w", uuid.uuid4().hex)
            self._calls = itertools.count(1)
        return self._writer_key

    def _run_script(
        self, script: Script, keys: Sequence[str], args: Sequence[bytes | int | str]
    ) -> object:
        """Call `script` (EVALSHA; loaded on NOSCRIPT) on this handle's own connection.

        The hot path of a worker (one call per task): the command is packed here and sent
        on a connection held by the handle, instead of going through redis-py's client
        (a pool checkout and return, argument encoding and observability hooks cost ~0.1 ms
        of CPU per call, measured, about as much as the round trip). A new connection still
        runs `_on_connect` (the identity check); errors are redis-py's, retried by `_call`.
        A cluster client has no one connection (each key's node has its own): there the
        script goes through redis-py, which routes it by its keys' slot."""
        if self._clustered:
            return script(keys=list(keys), args=list(args), client=self._client)
        conn = self._conn
        if conn is None or self._conn_pid != os.getpid():
            # after a fork, the parent's connection is not ours: the pool gives a new one
            conn = self._conn = self._client.connection_pool.get_connection()
            self._conn_pid = os.getpid()
        packed = _pack_evalsha(script.sha, keys, args)
        try:
            conn.send_packed_command([packed], check_health=False)  # type: ignore[no-untyped-call]
            return conn.read_response()
        except rex.NoScriptError:
            load = _pack(b"SCRIPT", b"LOAD", cast("str", script.script))
            conn.send_packed_command([load], check_health=False)  # type: ignore[no-untyped-call]
            conn.read_response()
            conn.send_packed_command([packed], check_health=False)  # type: ignore[no-untyped-call]
            return conn.read_response()
        except (rex.ConnectionError, rex.TimeoutError, TimeoutError, OSError):
            conn.disconnect()  # type: ignore[no-untyped-call]
            raise

    def _entries(self, raw: object) -> list[Entry]:
        if raw is None:
            return []
        if not isinstance(raw, list):
            raise LogError(f"{self.name}: unexpected reply from redis: {type(raw).__name__}")
        entries: list[Entry] = []
        for item in raw:
            raw_id, fields = cast("tuple[object, object]", item)
            if not isinstance(raw_id, (bytes, str)):
                raise LogError(f"{self.name}: unexpected entry id from redis: {raw_id!r}")
            ms, seq = parse_id(raw_id)
            position = pack_id(ms, seq)
            data = fields.get(b"d") if isinstance(fields, dict) else None
            if not isinstance(data, bytes):
                raise CorruptLogError(
                    self.name, position, f"stream entry {ms}-{seq} has no 'd' field"
                )
            entries.append(Entry(position, position + 1, data, server_time_us=ms * 1000))
        return entries

    # -- the interface

    def append(self, data: bytes, *, durable: bool = False) -> int:
        """Append one record (the server's AOF policy decides durability)."""
        return self.append_many([data], durable=durable)[0]

    def append_many(self, records: Sequence[bytes], *, durable: bool = False) -> list[int]:
        """Append records as one contiguous, all-or-nothing run (one script call)."""
        return self._append(records, None, 0)[0]

    def append_and_read(
        self, records: Sequence[bytes], read_from: int, *, durable: bool = False, max_records: int
    ) -> tuple[list[int], list[Entry]]:
        """`append_many`, and the entries from `read_from` through the last record appended
        (at most `max_records`), read by the same script call: one round trip."""
        return self._append(records, read_from, max_records)

    def _append(
        self, records: Sequence[bytes], read_from: int | None, max_records: int
    ) -> tuple[list[int], list[Entry]]:
        self._check_open()
        if self.read_only:
            raise LogError(f"{self.name} is opened read-only: nothing may be appended")
        total = 0
        for data in records:
            if len(data) > self.max_record:
                raise RecordTooLargeError(len(data), self.max_record)
            total += len(data)
        if not records:
            return [], []
        if total > MAX_BATCH_BYTES:
            raise AppendError(
                f"{self.name}: a batch of {total} bytes is more than one append may send "
                f"({MAX_BATCH_BYTES} bytes); append it in smaller batches"
            )
        writer = self._writer()
        call = next(self._calls)
        first = "" if read_from is None else format_id(*unpack_position(read_from))
        args: list[bytes | int | str] = [call, DEDUP_TTL_MS, SEQ_LIMIT, first, max_records]
        args += [self._queue_arg, *records]
        keys = [self.key, writer, self.start_key, self.id_key, self.removed_key]

        def run() -> object:
            return self._run_script(self._script, keys, args)

        try:
            raw = self._call("append to", run, AppendError)
        except AppendError as exc:
            if "QWSEQ" in str(exc):
                raise AppendError(
                    f"{self.name}: cannot append: the stream's last id has {SEQ_LIMIT - 1} "
                    "entries in one millisecond already (has the server's clock stood "
                    "still?); nothing was appended"
                ) from exc
            raise
        ids, blob = raw if isinstance(raw, list) and len(raw) == 2 else (None, None)
        if not isinstance(ids, list) or len(ids) != len(records) or not isinstance(blob, bytes):
            raise AppendError(
                f"{self.name}: the append's reply does not account for its {len(records)} "
                f"records ({raw!r:.200}); the stream may have been trimmed"
            )
        positions = [pack_id(*parse_id(cast("bytes", i))) for i in ids]
        return positions, self._parse_entries(blob)

    def read(self, position: int, max_records: int | None = None) -> list[Entry]:
        self._check_open()
        if max_records is not None and max_records <= 0:
            return []
        first = format_id(*unpack_position(position))
        if self._script_reads:
            count = max_records if max_records is not None else READ_ALL

            def by_script() -> object:
                try:
                    keys = [self.key, self.start_key, self.id_key]
                    args: list[bytes | int | str] = [first, count, self._queue_arg]
                    return self._run_script(self._read_script, keys, args)
                except rex.ResponseError as exc:
                    if _own_refusal(exc):
                        raise
                    self._script_reads = False  # scripts refused here: XRANGE from now on
                    return None

            try:
                blob = self._call("read from", by_script)
            except LogError as exc:
                if TRIMMED_ERROR in str(exc):
                    raise PositionCompactedError(self.name, position, self.start) from None
                raise
            if isinstance(blob, bytes):
                return self._parse_entries(blob)
        raw = self._call(
            "read from",
            lambda: self._client.xrange(self.key, min=first, max="+", count=max_records),
        )
        # after the XRANGE: a trim since may have taken what it skipped over
        if position < self.start:
            raise PositionCompactedError(self.name, position, self.start)
        return self._entries(raw)

    def drop_before(self, position: int) -> int:
        """``XTRIM <key> MINID <position's id>``: exact (not ``~``), so the stream starts
        at that record."""
        minid = format_id(*unpack_position(position))
        self._call("trim", lambda: self._client.xtrim(self.key, minid=minid, approximate=False))
        return position

    def check(self, start: int | None = None) -> int:
        """Log.check's look for damage (what `read` would refuse: an entry without a 'd'
        field, a sequence number it cannot pack), made on the server in batches of
        CHECK_BATCH: the records themselves are not sent (a backlog of 10,000 tasks read
        and parsed cost `qw up` ~12 ms of CPU and 75-230 ms before its first worker,
        measured at load 4). Where scripts are refused: read, as Log.check does.

        First, the stream's history (`verify_history`): a stream that lost entries qw did
        not remove is refused (LostHistoryError) before any of it is looked at."""
        self._check_open()
        self.verify_history()
        if not self._script_reads:
            return super().check(start)
        position = self.start if start is None else max(start, self.start)
        while True:
            first = format_id(*unpack_position(position))

            def by_script(first: str = first) -> object:
                try:
                    keys = [self.key, self.start_key, self.id_key]
                    args: list[bytes | int | str] = [first, CHECK_BATCH, _SEQ_MASK, self._queue_arg]
                    return self._run_script(self._check_script, keys, args)
                except rex.ResponseError as exc:
                    if _own_refusal(exc):
                        raise
                    self._script_reads = False  # scripts refused here: as `read` does
                    return None

            try:
                raw = self._call("check", by_script)
            except LogError as exc:
                if TRIMMED_ERROR in str(exc):
                    raise PositionCompactedError(self.name, position, self.start) from None
                raise
            if raw is None:
                return super().check(position)
            if not isinstance(raw, list) or len(raw) != 3:
                raise LogError(f"{self.name}: unexpected reply from redis: {raw!r:.80}")
            count, last, bad = raw
            if bad:
                ms, seq = parse_id(cast("bytes", bad))
                at = pack_id(ms, seq)  # raises LogError for a sequence it cannot pack
                raise CorruptLogError(self.name, at, f"stream entry {ms}-{seq} has no 'd' field")
            if not count:
                return position
            position = pack_id(*parse_id(cast("bytes", last))) + 1
            if count < CHECK_BATCH:
                return position

    def verify_history(self) -> str:
        """Check that the stream still holds every entry ever added to it but those qw
        removed itself; return what was verified, in a few words (the report says it).

        Redis counts the entries added to a stream (``entries-added``, 7.0 and later), and
        every script of qw that removes entries (compaction's trim, whose fold checkpoint
        accounts for them; an append undone) counts them in `removed_key` in the same
        step. Entries gone that qw did not remove (``XTRIM`` or ``XDEL`` by hand, an
        evicting server) make the counts disagree: LostHistoryError, naming them, since
        a fold of what is left would run tasks again or call them done without proof.
        Where the server keeps no count (before 7.0), or an older qw trimmed the stream
        without counting, nothing can be checked, and the answer says so."""

        def counts() -> object:
            try:
                keys = [self.key, self.start_key, self.removed_key]
                return self._run_script(self._history_script, keys, [])
            except rex.ResponseError as exc:
                if _own_refusal(exc):
                    raise
                return None  # scripts refused here (an ACL without EVALSHA)

        raw = self._call("verify the history of", counts)
        if raw is None:
            return f"{self.key}: not verified (the server refuses qw's scripts)"
        if not isinstance(raw, list) or len(raw) != 4 or not all(type(n) is int for n in raw):
            raise LogError(f"{self.name}: unexpected reply from redis: {raw!r:.80}")
        added, length, removed, started = raw
        if added < 0:
            return f"{self.key}: not verified (Redis before 7.0 counts no stream's entries)"
        if removed < 0 and started:
            return f"{self.key}: not verified (trimmed by a qw that kept no count of it)"
        removed = max(removed, 0)
        if added - length != removed:
            raise LostHistoryError(
                f"{self.name}: the stream holds {length} of the {added} entries ever added "
                f"to it, and qw removed {removed} (compaction, covered by the fold "
                f"checkpoint): {added - length - removed} entries are gone that qw did not "
                "remove (trimmed or deleted by hand?); the history is lost, and a replay "
                "of what is left would not be the queue's"
            )
        return f"{self.key}: {length} entries held of {added} added, {removed} removed by qw"

    def _parse_entries(self, blob: bytes) -> list[Entry]:
        """The entries of a script's reply (the format is described in lua/entries.lua)."""
        if not blob:
            return []
        newline = blob.find(b"\n")
        try:
            data_at = newline + 1 + int(blob[:newline])
            tokens = blob[newline + 1 : data_at].split()
            # ids come from the server: "<ms>-<seq>", so int() may parse their halves
            numbers = list(map(int, b" ".join(tokens[0::2]).replace(b"-", b" ").split()))
            lengths = list(map(int, tokens[1::2]))
        except ValueError:
            numbers, lengths = [], []
        if newline <= 0 or not lengths or len(numbers) != 2 * len(lengths):
            raise LogError(f"{self.name}: unexpected reply from redis: {blob[:80]!r}")
        entries: list[Entry] = []
        append = entries.append
        new = _tuple_new  # Entry(...) runs a Python-level __new__: this is the C one
        at = data_at
        halves = iter(numbers)
        for ms, seq, length in zip(halves, halves, lengths, strict=True):
            if seq > _SEQ_MASK or length < 0:
                position = pack_id(ms, seq)  # raises LogError for a sequence it cannot pack
                raise CorruptLogError(
                    self.name, position, f"stream entry {ms}-{seq} has no 'd' field"
                )
            position = (ms << SEQ_BITS) | seq
            end = at + length
            append(new(Entry, (position, position + 1, blob[at:end], ms * 1000)))
            at = end
        if at != len(blob):
            raise LogError(f"{self.name}: unexpected reply from redis: {blob[:80]!r}")
        return entries

    def wait(self, position: int, timeout: float) -> bool:
        self._check_open()
        after = after_id(position)
        deadline = time.monotonic() + max(timeout, 0.0)

        def poll() -> object:
            remaining = deadline - time.monotonic()
            if timeout <= 0 or remaining <= 0:
                return self._client.xread({self.key: after}, count=1)
            block_ms = max(1, math.ceil(min(remaining, BLOCK_CHUNK_S) * 1000))
            return self._blocking.xread({self.key: after}, count=1, block=block_ms)

        while True:
            if self._call("wait on", poll):
                return True
            if time.monotonic() >= deadline:
                # idle: a cheap moment to notice a reset server that never dropped us
                self._call("check the identity of", self._check_identity)
                return False

    @property
    def start(self) -> int:
        """0, or where compaction trimmed the stream to (logstore.redis.trim)."""
        client = self._client
        raw = self._call("find the start of", lambda: client.get(self.start_key))
        return 0 if raw is None else pack_id(*parse_id(raw))

    @property
    def origin(self) -> int:
        return 0

    def end(self) -> int:
        self._check_open()
        raw = self._call(
            "find the end of", lambda: self._client.xrevrange(self.key, "+", "-", count=1)
        )
        if not raw:
            return self.start
        [(last_id, _fields)] = cast("list[tuple[bytes, object]]", raw)
        return pack_id(*parse_id(last_id)) + 1

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._writer_pid == os.getpid():
            # best effort: the record expires by itself anyway (and a reset server has
            # none: a new connection's identity check refuses it)
            with contextlib.suppress(rex.RedisError, IdentityError):
                self._client.delete(self._writer_key)
        if self._conn is not None and self._conn_pid == os.getpid():
            self._client.connection_pool.release(self._conn)
        self._conn = None
        self._client.close()
        self._blocking.close()

    # -- other modules' scripts on this stream (queue_worker.redis.server_verdicts)

    def register_script(self, source: str) -> Script:
        """A Lua script to run with `call_script` or `call_appending_script`."""
        return self._client.register_script(source)

    def call_script(
        self, script: Script, keys: Sequence[str], args: Sequence[bytes | int | str]
    ) -> object:
        """Run a script that only reads: KEYS = [this stream, *keys], retried as a read."""
        return self._call("read from", lambda: self._run_script(script, [self.key, *keys], args))

    def call_appending_script(
        self, script: Script, keys: Sequence[str], args: Sequence[bytes | int | str]
    ) -> object:
        """Run a script that appends to this stream, retried as an append is (AppendError
        when it gives up). KEYS = [this stream, this handle's last-append record, *keys,
        the queue identity, the count of entries qw removed]; ARGV = [the call number, the
        record's ttl (ms), the seq limit, *args, the queue id]: the script checks the
        identity before anything else (QUEUE_LUA: IdentityError when the server was
        reset), counts an entry it undoes, and keeps its reply in the record under the
        call number and answers a retry with it, as `_APPEND_LUA` does, so that a call
        whose reply was lost is not made twice."""
        self._check_open()
        if self.read_only:
            raise LogError(f"{self.name} is opened read-only: nothing may be appended")
        keys = [self.key, self._writer(), *keys, self.id_key, self.removed_key]
        argv: list[bytes | int | str] = [next(self._calls), DEDUP_TTL_MS, SEQ_LIMIT, *args]
        argv.append(self._queue_arg)
        return self._call("append to", lambda: self._run_script(script, keys, argv), AppendError)

    def __repr__(self) -> str:
        return f"RedisLog({self.name!r})"


def _pack(*args: bytes | int | str) -> bytes:
    """One command in the Redis protocol (RESP): an array of bulk strings."""
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        parts += (b"$%d\r\n" % len(data), data, b"\r\n")
    return b"".join(parts)


def _pack_evalsha(
    sha: str | bytes, keys: Sequence[str], args: Sequence[bytes | int | str]
) -> bytes:
    """`_pack(b"EVALSHA", sha, len(keys), *keys, *args)`, its head (the script and its keys,
    the same at every call of a handle) packed once and kept: a worker's claiming call has
    5 keys and 16 arguments, and packing it all each time was ~8 % of its loop's CPU.

    A text argument's packed form is kept too (most are the same at every call: the
    worker's name, '1', '0', '', a record's type), and a number is formatted as text in
    one step: the claiming call's arguments ~15 → ~7.5 µs of CPU to pack (micro-benchmark)."""
    cached = (sha, *keys)
    head = _heads.get(cached)
    if head is None:
        if len(_heads) >= _HEADS_KEPT:  # (a process that makes many handles: start over)
            _heads.clear()
        head = _heads[cached] = _pack(b"EVALSHA", sha, len(keys), *keys)[
            len(b"*%d\r\n" % (len(keys) + 3)) :
        ]
    parts = [b"*%d\r\n" % (len(keys) + 3 + len(args)), head]
    append = parts.append
    texts = _texts
    for arg in args:
        if isinstance(arg, bytes):
            append(b"$%d\r\n%b\r\n" % (len(arg), arg))
        elif type(arg) is int:
            digits = str(arg)  # (ASCII: its length in characters is its length in bytes)
            append(f"${len(digits)}\r\n{digits}\r\n".encode())
        else:
            packed = texts.get(arg)
            if packed is None:
                if len(texts) >= _TEXTS_KEPT:  # (many different texts: start over)
                    texts.clear()
                data = str(arg).encode()
                packed = texts[arg] = b"$%d\r\n%b\r\n" % (len(data), data)
            append(packed)
    return b"".join(parts)


#: the packed heads of script calls (`_pack_evalsha`), by the script's sha and its keys
_heads: dict[tuple[str | bytes, ...], bytes] = {}
_HEADS_KEPT: Final = 256
#: text arguments of script calls, packed (`_pack_evalsha`)
_texts: dict[object, bytes] = {}
_TEXTS_KEPT: Final = 1024


def _driver_kwargs() -> dict[str, object]:
    """The client's name and version for CLIENT SETINFO, resolved once per process.

    redis-py 7 and later resolve them anew for every client and every connection made
    without them (`DriverInfo`: `importlib.metadata.version("redis")`, which parses the
    package's metadata with the email parser): ~2 ms of CPU a connection, measured, and a
    worker makes 5-6 as it starts. The same values, given once: redis-py sends the same
    CLIENT SETINFO. Older redis-py reads its version once, at its import: nothing to give."""
    global _driver
    if _driver is None:
        try:
            from redis.driver_info import DriverInfo
        except ImportError:
            _driver = {}
        else:
            _driver = {"driver_info": DriverInfo()}
    return _driver


_driver: dict[str, object] | None = None


#: errors that mean "the server (or the cluster node that owns the key) is out of reach":
#: retried, then reported as such
_UNREACHABLE: tuple[type[Exception], ...] = (
    rex.ConnectionError,
    rex.TimeoutError,
    TimeoutError,
    rex.ClusterDownError,
    rex.SlotNotCoveredError,
)


def _cluster_client(url: str, **kwargs: Any) -> redis.Redis:
    """A RedisCluster client for `url` (any node), with the settings of a plain client."""
    retry = kwargs.pop("retry")  # the cluster client's own argument, not its nodes'
    client = _cluster_class().from_url(url, retry=retry, **kwargs)
    # Typed as the plain client: the handle calls only single-key commands and scripts,
    # which both clients provide alike.
    return cast("redis.Redis", client)


@functools.cache
def _cluster_class() -> type[Any]:
    """RedisCluster, asking the server for its command table once per process.

    A RedisCluster client reads the whole ``COMMAND`` table when it is made (to find the
    keys of commands whose keys move): ~0.5 s of parsing here, and a process opens several
    handles of two clients each — a worker process on three partitions spent most of a
    minute on it under load. The table is the server's, the same for every client of one
    cluster (of one Redis version), so the first client's answer serves the others."""
    from redis.cluster import RedisCluster

    table: dict[str, Any] = {}

    class CommandTableOnce(RedisCluster):
        def command(self, **kwargs: Any) -> Any:
            if not table:
                table.update(super().command(**kwargs))
            return dict(table)

    return CommandTableOnce


def _text(raw: object) -> str:
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "replace")
    return str(raw)
