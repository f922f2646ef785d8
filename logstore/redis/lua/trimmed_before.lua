-- trimmed_before(start key, id): the start id when `id` is before it, nil otherwise. Ids
-- are compared as (ms, seq) numbers: both fit a Lua double exactly (ms < 2^53, seq < 2^20).
local function trimmed_before(start_key, first)
  local s = redis.call('GET', start_key)
  if not s then return nil end
  local sm, ss = string.match(s, '^(%d+)-(%d+)$')
  local fm, fs = string.match(first, '^(%d+)-(%d+)$')
  sm, ss, fm, fs = tonumber(sm), tonumber(ss), tonumber(fm), tonumber(fs)
  if fm < sm or (fm == sm and fs < ss) then return s end
  return nil
end
