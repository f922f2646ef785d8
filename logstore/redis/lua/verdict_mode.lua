-- A queue's identity and verdict mode (logstore.redis.verdict_mode.resolve), created together.
-- KEYS[1] the identity, KEYS[2] the mode, KEYS[3..] the family's verdict-state hashes.
-- ARGV[1] a new queue id ('' creates nothing), ARGV[2] the mode a new queue gets, ARGV[3]
-- the state's field whose presence makes a queue created before the mode was recorded a
-- server one. Returns {identity or false, mode or false, '1' when this call created the
-- queue}.
local id = redis.call('GET', KEYS[1])
if not id then
  if ARGV[1] == '' then return {false, false, '0'} end
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('SET', KEYS[2], ARGV[2])
  return {ARGV[1], ARGV[2], '1'}
end
local mode = redis.call('GET', KEYS[2])
if mode then return {id, mode, '0'} end
for i = 3, #KEYS do
  if redis.call('HEXISTS', KEYS[i], ARGV[3]) == 1 then
    return {id, 'legacy-server', '0'}
  end
end
return {id, 'legacy-client', '0'}
