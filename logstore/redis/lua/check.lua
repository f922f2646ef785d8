-- The start-up check (RedisLog.check), after trimmed_before.lua and queue_refused.lua:
-- what `read` would refuse as damage, looked for on the server, so that checking a backlog
-- costs no reply of its records. KEYS as read.lua's; ARGV[1] the first id, ARGV[2] the most
-- entries, ARGV[3] the largest sequence number, ARGV[4] the queue id. Returns {entries
-- looked at, the last one's id ('' for none), the id of the first entry without a 'd'
-- field or with a sequence number past 2^SEQ_BITS - 1 ('' for none)}: the look stops at it.
local refused = queue_refused(KEYS[3], ARGV[4])
if refused then return refused end
local start = trimmed_before(KEYS[2], ARGV[1])
if start then return redis.error_reply('QWTRIMMED ' .. start) end
local n, last, bad = 0, '', ''
for _, e in ipairs(redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])) do
  n, last = n + 1, e[1]
  local f, has = e[2], false
  for j = 1, #f, 2 do
    if f[j] == 'd' then has = true break end
  end
  if not has or tonumber(string.match(e[1], '-(%d+)$')) > ARGV[3] + 0 then
    bad = e[1]
    break
  end
end
return {n, last, bad}
