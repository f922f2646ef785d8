-- entry_counts(stream): the entries ever added to it (-1: the server does not count them,
-- Redis before 7.0) and the entries it holds; 0, 0 for no stream. Their difference is how
-- many entries left it, by any command (XTRIM, XDEL).
local function entry_counts(key)
  if redis.call('EXISTS', key) == 0 then return 0, 0 end
  local added, length = -1, 0
  local info = redis.call('XINFO', 'STREAM', key)
  for i = 1, #info, 2 do
    if info[i] == 'entries-added' then added = info[i + 1]
    elseif info[i] == 'length' then length = info[i + 1] end
  end
  return added, length
end
