-- The server's state at one moment (ServerVerdicts.state). KEYS[1] the claims stream,
-- KEYS[2] the state, KEYS[3] the index of open tasks. Returns {the id of the last entry
-- ever added to the stream ('' for none: a trim of the front leaves it as it was), every
-- field and value of the state, every task and score of the index}.
local tail_id = ''
if redis.call('EXISTS', KEYS[1]) == 1 then
  local info = redis.call('XINFO', 'STREAM', KEYS[1])
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' and info[i + 1] ~= '0-0' then tail_id = info[i + 1] end
  end
end
return {tail_id, redis.call('HGETALL', KEYS[2]),
        redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')}
