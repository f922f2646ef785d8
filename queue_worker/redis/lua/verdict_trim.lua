-- The claims stream's trim with the server verdicts' state (queue_worker.compaction.verdict_trim),
-- after logstore/redis/lua/trim_to_start.lua (and what it needs). KEYS[1] the claims
-- stream, KEYS[2] its start key, KEYS[3] the count of entries qw removed from it, KEYS[4]
-- the verdicts' state. ARGV[1] the new start id, ARGV[2] the watermark (every task below it
-- closed), ARGV[3..] the dead tasks from the state's ~below up to the watermark (their
-- fields stay). When the state exists, drops the fields of the other tasks from ~below to
-- the watermark and moves ~below there. Returns {the entries removed, the fields dropped}.
local dropped = 0
if redis.call('EXISTS', KEYS[4]) == 1 then
  local old = tonumber(redis.call('HGET', KEYS[4], '~below') or '0')
  local below = tonumber(ARGV[2])
  if below > old then
    local keep = {}
    for i = 3, #ARGV do keep[ARGV[i]] = true end
    local batch = {}
    for t = old, below - 1 do
      local field = string.format('%d', t)
      if not keep[field] then batch[#batch + 1] = field end
      if #batch == 1000 then  -- (a Lua call's arguments go on its stack)
        dropped = dropped + redis.call('HDEL', KEYS[4], unpack(batch))
        batch = {}
      end
    end
    if #batch > 0 then dropped = dropped + redis.call('HDEL', KEYS[4], unpack(batch)) end
    redis.call('HSET', KEYS[4], '~below', string.format('%d', below))
  end
end
return {removed, dropped}
