"""The shared state of a file log: ``<log>.sync``, a few words every handle of the log maps
into memory (mmap), read and written by `logstore.file.log` (appends, group commit, rolls)
and `logstore.file.reads` (where a reader may stop). What each word means and when it is
written is in `logstore.file.log`'s docstring."""

import struct
from typing import Final

U64: Final = struct.Struct("<Q")
LOAD: Final = U64.unpack_from
STORE: Final = U64.pack_into
#: byte offsets of the words
SYNCED: Final = 0  # the offset up to which the file is on stable storage (under the sync flock)
COMMITTED: Final = 8  # the end of the last append that completed (under the append lock)
ACTIVE: Final = 16  # the base of the active segment (under the append lock); 0: not known yet
SEGMENT_BYTES: Final = 24  # the segment size set by a handle opened with one; 0: the default
PENDING: Final = 32  # the end of the last append begun (under the append lock): "Zeros ahead"
FILE_END: Final = 40  # the active segment's size, as a position, as the last append left it
#: COMMITTED, ACTIVE, PENDING and FILE_END are read and written as words of a native-order
#: view of the mapping (`FileLog._words`): every append compares them, and a memoryview item
#: costs a third of a struct.unpack_from (the state file never leaves its machine, so native
#: order is its order)
COMMITTED_WORD: Final = COMMITTED // 8
ACTIVE_WORD: Final = ACTIVE // 8
PENDING_WORD: Final = PENDING // 8
FILE_END_WORD: Final = FILE_END // 8
STATE_SIZE: Final = 48
OLD_STATE_SIZE: Final = 16  # a state file of a qw before segments (no ACTIVE word)
