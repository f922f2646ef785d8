"""A fold reader's read of a claims file log: its frames walked and each record decoded
where it lies, with no `Entry` and no payload copy (`FileLog.read_span`).

A catch-up reads every record of the claims log only to fold it: it needs the records and
their positions, not entries. `loop()` is the span loop `FileLog.read_span` runs: the C
one (`queue_worker/protocol/_cdecode.c`'s `decode_claims_frames`) when built, else
`decode_claims_frames_py`, its
definition: `framing._decode_loop`'s walk, then `records.decode_claims_py` of the payloads.
"""

from __future__ import annotations

from typing import Any

from logstore.base import SpanLoop, SpanResult
from logstore.file import framing
from queue_worker.protocol import records
from queue_worker.protocol.records import Claim, Done


def decode_claims_frames_py(
    buf: bytes, max_record: int, verified: int, limit: int, base: int
) -> SpanResult:
    """(records, positions, pos, batch_start, ready): `framing._decode_loop` of `buf`, each
    payload decoded as `decode_claims_all` decodes it (None for a malformed one), each
    offset made absolute (file offset `base` + offset in `buf`)."""
    starts, datas, pos, batch_start, ready = framing._decode_loop(buf, max_record, verified, limit)
    decoded: list[Any] = records.decode_claims_py(datas)
    return decoded, [start + base for start in starts], pos, batch_start, ready


def loop() -> SpanLoop:
    """The span loop of a claims follower: in C when built (see the module's doc)."""
    module = records._c_module()
    if module is None:
        return decode_claims_frames_py
    fused = module.decode_claims_frames
    fallback = records._claims_or_none

    def c_loop(buf: bytes, max_record: int, verified: int, limit: int, base: int) -> SpanResult:
        found: SpanResult = fused(buf, max_record, verified, limit, base, Claim, Done, fallback)
        return found

    return c_loop
