-- The fold's rules (queue_worker.redis.server_verdicts), shared by every script that
-- appends claims records (verdict.lua, next_task.lua), after
-- logstore/redis/lua/queue_refused.lua. KEYS[1] the claims stream, KEYS[2] this handle's
-- last-append record, KEYS[3] the per-task state, KEYS[4] the index of open tasks (a sorted
-- set: an open task's score is when it may next be claimed, its holder's expiry or its
-- retry_at), KEYS[5] the tasks stream, KEYS[6], KEYS[7] and KEYS[8] the tasks the claiming
-- script's cursor passed over (parked.lua; the same KEYS for every folding script, since a
-- record that closes a task may let the tasks waiting for it go). ARGV[1] the call number, ARGV[2] the last-append record's ttl
-- (ms), ARGV[3] the seq limit; after the script's own, the queue identity and the count of
-- entries qw removed from the stream are the last two KEYS, the queue id the last ARGV
-- (RedisLog.call_appending_script).
local QUEUE_KEY, REMOVED_KEY, QUEUE_ID = KEYS[#KEYS - 1], KEYS[#KEYS], ARGV[#ARGV]

-- What a call has read of the state, and what it writes at its end (`flush`): one HMGET
-- of the fields of the whole queue, one HGET per task, one HSET for everything (every
-- redis.call costs the server a few µs: this script is run once per record or task).
local meta = nil   -- {through, tasks (cursor), next (task id), below, ahead, parked, after}
local cache = {}   -- task -> its state (a table), or false: no field
local written = {} -- task -> its state packed, to write
local order = {}   -- the tasks in `written`, in order
-- the tasks whose state the call will read (a list): fetched by the same HMGET as the
-- queue's fields (a redis.call is ~5 us of the server's CPU however small its work, measured)
local prefetch = nil

local function get_meta()
  if not meta then
    local fields = {'~through', '~tasks', '~next', '~below', '~ahead', '~parked', '~after'}
    for _, t in ipairs(prefetch or {}) do fields[#fields + 1] = t end
    local m = redis.call('HMGET', KEYS[3], unpack(fields))
    for i = 8, #fields do
      if m[i] then cache[fields[i]] = cmsgpack.unpack(m[i]) else cache[fields[i]] = false end
    end
    meta = {through = m[1] or '0-0', tasks = m[2] or nil,
            next = tonumber(m[3] or '0'), below = tonumber(m[4] or '0'),
            -- `ahead`: the last task of a priority above 0 a producer appended (its entry
            -- id: the cursor must pass it before a fresh task is picked); `parked`: tasks
            -- the cursor passed over wait in KEYS[6] or KEYS[7] (next_task.lua); `after`:
            -- tasks wait in KEYS[8] for a dependency to close (parked.lua)
            ahead = m[5] or nil, parked = m[6] == '1', after = m[7] == '1',
            folded = false, moved = false, unahead = false, reparked = false,
            reafter = false}
  end
  return meta
end

-- a task's state (nil: none). A task below `~below` with no field is done: compaction
-- drops the fields of done tasks below the fold's watermark (and keeps dead ones).
local function load(task)
  local st = cache[task]
  if st == nil then
    local raw = redis.call('HGET', KEYS[3], task)
    if raw then st = cmsgpack.unpack(raw) else st = false end
    cache[task] = st
  end
  if st then return st end
  if tonumber(task) < get_meta().below then return {s = 'd'} end
  return nil
end

local function flush()
  if not meta then return end
  local args = {}
  for _, t in ipairs(order) do
    args[#args + 1] = t
    args[#args + 1] = written[t]
  end
  if meta.folded then
    args[#args + 1] = '~through'
    args[#args + 1] = meta.through
  end
  if meta.moved then
    args[#args + 1] = '~tasks'
    args[#args + 1] = meta.tasks
    args[#args + 1] = '~next'
    args[#args + 1] = string.format('%d', meta.next)
  end
  if meta.reparked and meta.parked then
    args[#args + 1] = '~parked'
    args[#args + 1] = '1'
  end
  if meta.reafter and meta.after then
    args[#args + 1] = '~after'
    args[#args + 1] = '1'
  end
  if #args > 0 then redis.call('HSET', KEYS[3], unpack(args)) end
  if meta.unahead then redis.call('HDEL', KEYS[3], '~ahead') end
  if meta.reparked and not meta.parked then redis.call('HDEL', KEYS[3], '~parked') end
  if meta.reafter and not meta.after then redis.call('HDEL', KEYS[3], '~after') end
end

-- the id of the last entry ever added to a stream ('0-0': none), which a trim of its
-- front (compaction's XTRIM MINID) does not change, as it changes the last entry left
local function last_added(key)
  local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
  if last[1] then return last[1][1] end
  -- empty: never written, or trimmed to nothing
  if redis.call('EXISTS', key) == 0 then return '0-0' end
  local info = redis.call('XINFO', 'STREAM', key)
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then return info[i + 1] end
  end
  return '0-0'
end

-- nil, nil to go on; else a retried call's first reply (packed), or an error to give:
-- first of all, a queue identity that is not the handle's (a reset server: nothing of
-- its state or its streams is this queue's)
local function prelude()
  local refused = queue_refused(QUEUE_KEY, QUEUE_ID)
  if refused then return nil, refused end
  local mine = ARGV[1] .. ' '
  local last = redis.call('GET', KEYS[2])
  if last and string.sub(last, 1, #mine) == mine then
    return string.sub(last, #mine + 1), nil
  end
  local through = get_meta().through
  local tail_id = last_added(KEYS[1])
  if tail_id ~= through then
    return nil, redis.error_reply('QWBEHIND ' .. tail_id .. ' ' .. through)
  end
  return nil, nil
end

-- write what the call changed, keep the reply (packed) for a retry of this call (a lost
-- reply), and return it packed
local function save(reply)
  flush()
  local packed = cmsgpack.pack(reply)
  redis.call('SET', KEYS[2], ARGV[1] .. ' ' .. packed, 'PX', ARGV[2])
  return packed
end

-- the tasks a call closed (done or dead) while tasks wait for a dependency (`~after`), and
-- the time of the last: the waiting ones are looked at once the call's records are folded
-- (parked.lua, `wake`)
local closed, closed_at = {}, 0

-- Append one record and fold it: {entry id, verdict, the task's state after it (the
-- table itself, packed once with the whole reply; false for none)}, or an error reply.
-- `task_entry`: a winning CLAIM's task's entry id in the tasks stream, kept in its state
-- (the claiming script reads the payload with it); `priority` the task's (nil: 0), kept
-- too (the pick of an orphan goes by it).
local function fold_in(data, kind, task, worker, lease, claim, delta, err, task_entry, priority)
  if kind ~= 'C' and kind ~= 'R' and kind ~= 'D' and kind ~= 'F' and kind ~= 'V' then
    flush()
    return redis.error_reply('QWTYPE ' .. kind)
  end
  local id = redis.call('XADD', KEYS[1], '*', 'd', data)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  if tonumber(seq) >= tonumber(ARGV[3]) then
    redis.call('XDEL', KEYS[1], id)
    redis.call('INCRBY', REMOVED_KEY, 1)
    flush()
    return redis.error_reply('QWSEQ entry id ' .. id .. ' has a sequence number of '
      .. ARGV[3] .. ' or more within one millisecond')
  end
  local at = tonumber(ms) * 1000
  local st = load(task)
  -- Rule 2: the holder is a claim (its entry id) and its worker
  local function holds()
    return st ~= nil and st.s == 'o' and st.c == claim and st.w == worker
  end
  local verdict, changed = nil, true
  if kind == 'C' then  -- Rule 1
    if st and st.s == 'd' then verdict, changed = 'lost: done', false
    elseif st and st.s == 'x' then verdict, changed = 'lost: dead', false
    elseif st and st.c and at < st.e then verdict, changed = 'lost: held', false
    elseif st and st.r and at < st.r then verdict, changed = 'lost: backoff', false
    else
      if st and st.c then verdict = 'takeover' else verdict = 'won' end
      if st then  -- a copy: a reply may hold the table as an earlier record left it
        local old = st
        st = {}
        for k, v in pairs(old) do st[k] = v end
      else st = {s = 'o', n = 0} end
      st.c, st.w, st.a, st.e = id, worker, at, at + tonumber(lease)
      st.n = st.n + 1
      st.r = nil
      if task_entry then st.t = task_entry end
      if priority and priority ~= 0 then st.p = priority end
    end
  elseif kind == 'R' then  -- Rule 3
    if holds() then st.e = at + tonumber(lease); verdict = 'renewed'
    else verdict, changed = 'lease lost', false end
  elseif kind == 'D' then  -- Rule 4
    if holds() then st = {s = 'd'}; verdict = 'done'
    else verdict, changed = 'stale done', false end
  elseif kind == 'V' then  -- CANCEL, Rule 5: from anyone while the task is open
    if st and st.s ~= 'o' then verdict, changed = 'stale fail', false
    else st = {s = 'x', l = err}; verdict = 'dead' end
  else  -- FAIL, Rule 5
    if not holds() then verdict, changed = 'stale fail', false
    elseif delta == '' then st = {s = 'x', l = err}; verdict = 'dead'
    else
      st.c, st.w, st.a, st.e = nil, nil, nil, nil
      st.r = at + tonumber(delta)
      st.l = err
      verdict = 'released'
    end
  end
  local m = get_meta()
  m.through, m.folded = id, true
  if changed then
    cache[task] = st
    if not written[task] then order[#order + 1] = task end
    written[task] = cmsgpack.pack(st)
    if st.s ~= 'o' then
      redis.call('ZREM', KEYS[4], task)
      if m.after then closed[#closed + 1], closed_at = task, at end
    elseif st.c then redis.call('ZADD', KEYS[4], st.e, task)
    else redis.call('ZADD', KEYS[4], st.r, task) end
  end
  return {id, verdict, st or false}
end
