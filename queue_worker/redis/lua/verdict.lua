-- One record appended and folded (ServerVerdicts.append), after rules.lua and parked.lua.
-- ARGV[4] the record's bytes, ARGV[5] its type (C R D F, or V: a CANCEL), ARGV[6] the
-- task, ARGV[7] the worker (V: who cancelled), ARGV[8] the lease (C, R), ARGV[9] the
-- claim's entry id (R, D, F), ARGV[10] retry_at - at (F; '' for a dead task), ARGV[11] the
-- error (F, V). Returns {entry id, verdict, the task's state after it ('' for none)},
-- packed as one msgpack array (`unpack_reply`).
prefetch = {ARGV[6]}
local saved, refused = prelude()
if refused then return refused end
if saved then return saved end
local reply = fold_in(ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11])
if reply.err then return reply end
wake()  -- (the tasks waiting for the one this record closed: parked.lua)
return save(reply)
