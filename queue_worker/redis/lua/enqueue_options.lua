-- A task with options appended (queue_worker.redis.task_options), after queue_refused.lua.
-- KEYS[1] the tasks stream, KEYS[2] this handle's last-append record, KEYS[3] the first
-- task of each key (a hash: key -> its entry id), KEYS[4] the claims stream's verdict
-- state (server verdicts: its field ~ahead), then the queue identity and the count of
-- entries qw removed (RedisLog.call_appending_script). ARGV[1] the call number, ARGV[2] the
-- last-append record's ttl (ms), ARGV[3] the seq limit, ARGV[4] the record, ARGV[5] its
-- key ('' for none), ARGV[6] its delay's end and priority ("<not_before> <priority>": the
-- entry's field 'o', read by next_task.lua; '' for none), ARGV[7] '1' when the claiming
-- script must look ahead for it (a priority above 0 on a queue with server verdicts),
-- ARGV[8] its dependencies (the ids of earlier tasks, "3,5": the entry's field 'a', read by
-- next_task.lua; '' for none), the last ARGV the queue id. Returns {'1', the new entry's id}, or {'0', the entry id of the
-- key's first task} when the key has one: nothing is appended.
local QUEUE_KEY, REMOVED_KEY, QUEUE_ID = KEYS[#KEYS - 1], KEYS[#KEYS], ARGV[#ARGV]
local refused = queue_refused(QUEUE_KEY, QUEUE_ID)
if refused then return refused end
local mine = ARGV[1] .. ' '
local last = redis.call('GET', KEYS[2])
if last and string.sub(last, 1, #mine) == mine then
  return {string.sub(last, #mine + 1, #mine + 1), string.sub(last, #mine + 3)}
end
local function answer(fresh, id)
  redis.call('SET', KEYS[2], mine .. fresh .. ' ' .. id, 'PX', ARGV[2])
  return {fresh, id}
end
if ARGV[5] ~= '' then
  local first = redis.call('HGET', KEYS[3], ARGV[5])
  if first then return answer('0', first) end
end
local entry = {'d', ARGV[4]}
if ARGV[6] ~= '' then entry[#entry + 1], entry[#entry + 2] = 'o', ARGV[6] end
if ARGV[8] ~= '' then entry[#entry + 1], entry[#entry + 2] = 'a', ARGV[8] end
local id = redis.call('XADD', KEYS[1], '*', unpack(entry))
if tonumber(string.match(id, '-(%d+)$')) >= tonumber(ARGV[3]) then
  redis.call('XDEL', KEYS[1], id)
  redis.call('INCRBY', REMOVED_KEY, 1)
  return redis.error_reply('QWSEQ entry id ' .. id .. ' has a sequence number of '
    .. ARGV[3] .. ' or more within one millisecond')
end
if ARGV[5] ~= '' then redis.call('HSET', KEYS[3], ARGV[5], id) end
if ARGV[7] == '1' then redis.call('HSET', KEYS[4], '~ahead', id) end
return answer('1', id)
