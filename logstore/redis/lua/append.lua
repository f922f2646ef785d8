-- An append (RedisLog.append_and_read), after entries.lua, trimmed_before.lua and
-- queue_refused.lua. KEYS[1] the stream, KEYS[2] this handle's last-append record,
-- KEYS[3] the stream's start key (an id to read from that was trimmed away reads nothing:
-- the caller's read raises), KEYS[4] the queue identity, KEYS[5] the count of entries qw
-- removed from the stream (`verify_history`: an append undone counts). ARGV[1] the call
-- number, ARGV[2] the record's ttl (ms), ARGV[3] the seq limit, ARGV[4] the id to read from
-- ('' reads nothing), ARGV[5] the most entries to read, ARGV[6] the queue id, ARGV[7..] the
-- records. Returns {ids, entries from ARGV[4] through the last id added}.
local refused = queue_refused(KEYS[4], ARGV[6])
if refused then return refused end
local function reply(ids)
  if ARGV[4] == '' or trimmed_before(KEYS[3], ARGV[4]) then return {ids, ''} end
  return {ids, entries(KEYS[1], ARGV[4], ids[#ids], ARGV[5])}
end
local last = redis.call('GET', KEYS[2])
if last then
  local n, first, final = string.match(last, '^(%d+) (%S+) (%S+)$')
  if n == ARGV[1] then
    local ids = {}
    for i, e in ipairs(redis.call('XRANGE', KEYS[1], first, final)) do ids[i] = e[1] end
    return reply(ids)
  end
end
local ids = {}
local function undo()
  for _, id in ipairs(ids) do redis.call('XDEL', KEYS[1], id) end
  if #ids > 0 then redis.call('INCRBY', KEYS[5], #ids) end
end
for i = 7, #ARGV do
  local r = redis.pcall('XADD', KEYS[1], '*', 'd', ARGV[i])
  if type(r) == 'table' and r.err then
    undo()
    return r
  end
  ids[#ids + 1] = r
end
local limit = tonumber(ARGV[3])
for _, id in ipairs(ids) do
  if tonumber(string.match(id, '-(%d+)$')) >= limit then
    undo()
    return redis.error_reply('QWSEQ entry id ' .. id .. ' has a sequence number of '
      .. ARGV[3] .. ' or more within one millisecond')
  end
end
redis.call('SET', KEYS[2], ARGV[1] .. ' ' .. ids[1] .. ' ' .. ids[#ids], 'PX', ARGV[2])
return reply(ids)
