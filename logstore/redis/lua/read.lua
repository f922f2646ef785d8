-- A read (RedisLog.read), after entries.lua, trimmed_before.lua and queue_refused.lua.
-- KEYS[1] the stream, KEYS[2] its start key (logstore.redis.trim), KEYS[3] the queue
-- identity. ARGV[1] the first id, ARGV[2] the most entries, ARGV[3] the queue id. A first
-- id the stream was trimmed past is an error (QWTRIMMED).
local refused = queue_refused(KEYS[3], ARGV[3])
if refused then return refused end
local start = trimmed_before(KEYS[2], ARGV[1])
if start then return redis.error_reply('QWTRIMMED ' .. start) end
return entries(KEYS[1], ARGV[1], '+', ARGV[2])
