-- The trim of a stream's front (logstore.redis.trim), after trimmed_before.lua and
-- entry_counts.lua; a script ends it (trim.lua returns `removed`; the server verdicts'
-- trim, queue_worker/redis/lua/verdict_trim.lua, drops more in the same step).
-- KEYS[1] the stream, KEYS[2] its start key, KEYS[3] the count of entries qw removed from
-- it (`RedisLog.verify_history`). ARGV[1] the new start id. Moves the start key forward
-- (never back), trims the stream to it and counts what went, in one step; `removed` is the
-- count of entries removed. A stream an older qw trimmed has a start and no count: what it
-- lacks then is taken as that qw's trims.
if redis.call('EXISTS', KEYS[3]) == 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  local added, length = entry_counts(KEYS[1])
  if added >= 0 then redis.call('SET', KEYS[3], added - length) end
end
if not trimmed_before(KEYS[2], ARGV[1]) then
  redis.call('SET', KEYS[2], ARGV[1])
end
local removed = redis.call('XTRIM', KEYS[1], 'MINID', redis.call('GET', KEYS[2]))
redis.call('INCRBY', KEYS[3], removed)
