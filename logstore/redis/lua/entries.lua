-- entries(stream, first id, last id, most entries): the entries of a stream as one string
-- (RedisLog._parse_entries): the length of the header, a newline, the header, then every
-- entry's bytes one after the other. The header is, for each entry, its id and the length
-- of its 'd' field (-1 when it has none), all separated by spaces:
-- "<ms>-<seq> <length> <ms>-<seq> <length> ...". One string instead of XRANGE's nested
-- reply: redis-py parses a nested reply element by element, which cost a reader ~19 us of
-- CPU per entry (measured); and the header apart from the bytes, so that a reader splits
-- and converts all of its numbers at once (a few C calls for the whole batch) instead of
-- finding each entry's line (measured: ~5.5 -> ~2.3 us an entry).
local function entries(key, first, last, count)
  if tonumber(count) <= 0 then return '' end
  local heads, out = {}, {''}
  for _, e in ipairs(redis.call('XRANGE', key, first, last, 'COUNT', count)) do
    local f, d = e[2], nil
    for j = 1, #f, 2 do
      if f[j] == 'd' then d = f[j + 1] break end
    end
    if d then
      heads[#heads + 1] = e[1] .. ' ' .. #d
      out[#out + 1] = d
    else heads[#heads + 1] = e[1] .. ' -1' end
  end
  if #heads == 0 then return '' end
  local head = table.concat(heads, ' ')
  out[1] = #head .. '\n' .. head
  return table.concat(out)
end
