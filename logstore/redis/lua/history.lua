-- RedisLog.verify_history, after entry_counts.lua. KEYS[1] the stream, KEYS[2] its start
-- key, KEYS[3] the count of entries qw removed. Returns {entries ever added (-1: not
-- counted), entries held, entries qw removed (-1: no count kept), 1 when the start key is
-- set}, read at one moment.
local added, length = entry_counts(KEYS[1])
local removed = tonumber(redis.call('GET', KEYS[3]) or '-1')
return {added, length, removed, redis.call('EXISTS', KEYS[2])}
