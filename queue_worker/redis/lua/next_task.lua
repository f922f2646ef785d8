-- The claiming call (queue_worker.redis.server_claim, ServerClaims.next), after rules.lua
-- and parked.lua. KEYS[5] the tasks stream, KEYS[6], KEYS[7] and KEYS[8] the tasks its
-- cursor parked (due, by priority; delayed, by their delay's end; waiting for a dependency,
-- by it: parked.lua). ARGV[4..11] the previous task's DONE or FAIL (as verdict.lua
-- takes a record; ARGV[4] '' for none), ARGV[12] the worker, ARGV[13] its lease, ARGV[14]
-- its clock, ARGV[15] '1' to claim, ARGV[16] '1' to leave a predecessor's lapsed tasks to
-- the others for one lease (the worker has siblings), ARGV[17] how many tasks to claim at
-- most, ARGV[18] how many earlier DONEs or FAILs follow (the worker's batch, `ClaimBatch`),
-- 8 arguments each from ARGV[19], appended and folded in order before the one of
-- ARGV[4..11]. Returns, packed as one msgpack array (`unpack_reply`): {the finish's id,
-- verdict and state (the state a map, `reply_verdict`; '' each for none), the first
-- CLAIM's id, verdict and state, its task, the task's payload record ('' each for none);
-- when nothing was claimed, the last tasks entry read, the earliest time an open task
-- becomes claimable or a delay ends ('' for none), '1' when no task is open or delayed,
-- and the time the pick went by
-- ('' for none)}, then the id, verdict and state of each earlier finish, then the id,
-- verdict, state, task and payload of each CLAIM after the first.
local wanted = tonumber(ARGV[17])
local earlier = tonumber(ARGV[18])
local finishes = {}  -- the first argument of each record to fold before the pick, in order
for j = 0, earlier - 1 do finishes[#finishes + 1] = 19 + 8 * j end
if ARGV[4] ~= '' then finishes[#finishes + 1] = 4 end
if #finishes > 0 then  -- the finishes' tasks, read with the queue's fields
  prefetch = {}
  for _, b in ipairs(finishes) do prefetch[#prefetch + 1] = ARGV[b + 2] end
end
local saved, refused = prelude()
if refused then return refused end
if saved then return saved end
local reply = {'', '', '', '', '', '', '', '', '', '', '', ''}
local more = {}  -- the earlier finishes' answers, then the CLAIMs after the first
local finished_ms = nil
for _, b in ipairs(finishes) do
  local f = fold_in(ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3], ARGV[b + 4], ARGV[b + 5],
                    ARGV[b + 6], ARGV[b + 7])
  if f.err then return f end
  if b == 4 then reply[1], reply[2], reply[3] = f[1], f[2], f[3]
  else
    local n = #more
    more[n + 1], more[n + 2], more[n + 3] = f[1], f[2], f[3]
  end
  finished_ms = tonumber(string.match(f[1], '^(%d+)-'))
end
wake()  -- (the tasks waiting for one these finishes closed: the pick may hand them out)
-- a tasks entry's record, its delay's end and priority (its 'o' field, written by a
-- producer of a task with either: queue_worker.redis.task_options; 0, 0 without one), and
-- its dependencies (its 'a' field, "3,5"; nil without)
local function fields_of(entry)
  local fields, payload, nb, prio, deps = entry[2], '', 0, 0, nil
  for j = 1, #fields, 2 do
    if fields[j] == 'd' then payload = fields[j + 1]
    elseif fields[j] == 'o' then
      local a, b = string.match(fields[j + 1], '^(%-?%d+) (%-?%d+)$')
      if a then nb, prio = tonumber(a), tonumber(b) end
    elseif fields[j] == 'a' then deps = fields[j + 1]
    end
  end
  return payload, nb, prio, deps
end
local function payload_of(entry) return (fields_of(entry)) end
local function entry_payload(task_entry)
  local e = redis.call('XRANGE', KEYS[5], task_entry, task_entry)
  if e[1] then return payload_of(e[1]) end
  return nil
end
local now, withheld = nil, nil
local function lineage(w) return string.match(w, '^(.*)%-[^-]*%-[^-]*$') or w end
local mine = lineage(ARGV[12])
local taken = {}  -- the tasks this call claimed (not picked twice)
-- the untouched tasks, read `fetch` at a time: twice the tasks wanted when several are,
-- and the backlog is deep when the first read finds that many (only then are several
-- claimed: with few tasks left, each goes to a worker of its own)
local fetch = 1
if wanted > 1 then fetch = 2 * wanted end
local fresh, fresh_at, fetched, deep = {}, 1, false, false
local function fill()
  local m = get_meta()
  local start = '-'
  if m.tasks then start = '(' .. m.tasks end
  fresh, fresh_at = redis.call('XRANGE', KEYS[5], start, '+', 'COUNT', fetch), 1
  if not fetched then deep = #fresh == fetch end
  fetched = true
end
-- Tasks the cursor passes over without handing them out (a delay not over, a priority
-- other than 0, a lower id than a task of a priority above 0 further on, or a dependency
-- still open) wait beside the state: in KEYS[8] while a dependency is open, in KEYS[7]
-- until their delay ends, then in KEYS[6] (parked.lua: `wait`, `park`).
-- the cursor moved on by one entry: its task id
local function passed(e)
  local m = get_meta()
  local id = string.format('%d', m.next)
  m.tasks, m.next, m.moved = e[1], m.next + 1, true
  return id
end
-- a task of a priority above 0 appended since (`ahead`): every untouched task up to it is
-- parked, so that the pick sees it beside the others (once: then it is parked too). A
-- backlog before it is walked 1024 entries a step, their states read and their parking
-- written in one call each (a walk of 10,000 tasks is ~30 calls, not 30,000).
local function look_ahead()
  local m = get_meta()
  if not m.ahead then return end
  while true do
    local start = '-'
    if m.tasks then start = '(' .. m.tasks end
    local es = redis.call('XRANGE', KEYS[5], start, m.ahead, 'COUNT', 1024)
    if not es[1] then break end
    local ids = {}
    for i, e in ipairs(es) do ids[i] = passed(e) end
    local states = redis.call('HMGET', KEYS[3], unpack(ids))
    local ready, waiting = {}, {}
    for i, e in ipairs(es) do
      local id = ids[i]
      -- (untouched: no field, not below ~below, nothing of this call's for it)
      if not states[i] and cache[id] == nil and tonumber(id) >= m.below then
        local _, nb, prio, deps = fields_of(e)
        if deps and wait(id, e[1], nb, prio, deps) then  -- (waits for a dependency)
        elseif nb > now then
          waiting[#waiting + 1] = nb
          waiting[#waiting + 1] = member_of(id, e[1]) .. ' ' .. prio
        else
          ready[#ready + 1] = -prio
          ready[#ready + 1] = member_of(id, e[1])
        end
      end
    end
    if #ready > 0 then redis.call('ZADD', KEYS[6], unpack(ready)) end
    if #waiting > 0 then redis.call('ZADD', KEYS[7], unpack(waiting)) end
    if (#ready > 0 or #waiting > 0) and not m.parked then m.parked, m.reparked = true, true end
    if #es < 1024 then break end
  end
  m.ahead, m.unahead = nil, true
  fresh, fresh_at, fetched = {}, 1, false
end
-- the parked tasks whose delay is over move to KEYS[6]
local function promote()
  local due = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', now, 'LIMIT', 0, 256)
  for _, member in ipairs(due) do
    local head, prio = string.match(member, '^(.*) (%-?%d+)$')
    redis.call('ZADD', KEYS[6], -tonumber(prio), head)
    redis.call('ZREM', KEYS[7], member)
  end
end
-- the best parked task that is due ({task, entry, priority}), or nil; parked tasks another
-- record has touched since (a CANCEL) are dropped
local function top_parked()
  local m = get_meta()
  if not m.parked then return nil end
  while true do
    local top = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
    if not top[1] then
      if redis.call('ZCARD', KEYS[7]) == 0 then m.parked, m.reparked = false, true end
      return nil
    end
    local padded, entry = string.match(top[1], '^(%d+) (%S+)$')
    local task = string.format('%d', tonumber(padded))
    if not taken[task] and not load(task) then
      return {task, entry, -tonumber(top[2]), top[1]}
    end
    redis.call('ZREM', KEYS[6], top[1])
  end
end
-- the next untouched task of the cursor that may be handed out now (priority 0, no delay
-- ahead: the others are parked on the way), {task, entry, payload}, or nil
local function next_fresh()
  while true do
    if fresh_at > #fresh then
      if fetched and #fresh < fetch then return nil end  -- the stream's end, read already
      fill()
      if not fresh[1] then return nil end
    end
    local e = fresh[fresh_at]
    fresh_at = fresh_at + 1
    local id = passed(e)
    -- a task some CLAIM of another path has touched is the index's, or closed
    if not load(id) then
      local payload, nb, prio, deps = fields_of(e)
      if not (deps and wait(id, e[1], nb, prio, deps)) then  -- (else: waits for one)
        if nb <= now and prio == 0 then return {id, e[1], payload} end
        park(id, e[1], nb, prio, now)
      end
    end
  end
end
-- the due orphan to try first ({task, entry, priority}): the highest priority, then the
-- oldest lapse
local orphans = true  -- false once a look at the index found none due: none will be
local function best_orphan()
  if not orphans then return nil end
  -- not by the heir: a lapsed task of our predecessor (its name and host, another
  -- process) is left to the others for one lease after its lapse
  local due = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 16)
  local best = nil
  for _, t in ipairs(due) do
    if not taken[t] then
      local st = load(t)
      local until_us = nil
      if ARGV[16] == '1' and st and st.c and st.w ~= ARGV[12] and lineage(st.w) == mine then
        until_us = st.e + tonumber(ARGV[13])
      end
      if until_us and now < until_us then
        if not withheld or until_us < withheld then withheld = until_us end
      else
        local prio = (st and st.p) or 0
        if not best or prio > best[3] then best = {t, st and st.t, prio} end
      end
    end
  end
  if not best then orphans = false end
  return best
end
-- the pick: the highest priority first (orphans, then parked tasks, then the cursor's next
-- task, of priority 0, within one); those below 0 only when nothing else is due
local function pick()
  look_ahead()
  if get_meta().parked then promote() end
  local orphan, parked = best_orphan(), top_parked()
  local po, pp = -math.huge, -math.huge
  if orphan then po = orphan[3] end
  if parked then pp = parked[3] end
  local function from_parked()
    redis.call('ZREM', KEYS[6], parked[4])
    return parked[1], parked[2], entry_payload(parked[2]), parked[3]
  end
  local function from_orphan()
    local payload = nil
    if orphan[2] then payload = entry_payload(orphan[2]) end
    return orphan[1], orphan[2], payload, orphan[3]
  end
  if math.max(po, pp) > 0 or (orphan and po == 0) then
    if po >= pp then return from_orphan() end
    return from_parked()
  end
  if parked and pp == 0 then return from_parked() end
  local f = next_fresh()
  if f then return f[1], f[2], f[3], 0 end
  -- below 0, or nothing at all (the cursor may have parked a better one meanwhile)
  parked, pp = top_parked(), -math.huge
  if parked then pp = parked[3] end
  if orphan and po >= pp then return from_orphan() end
  if parked then return from_parked() end
  return nil
end
local claimed = 0
if ARGV[15] == '1' then
  -- now, on the stream's clock: the last finish's entry time when there is one (our
  -- CLAIMs come at or after it), else the server's clock to the millisecond below
  if finished_ms then now = finished_ms * 1000
  else
    local t = redis.call('TIME')
    now = (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)) * 1000
  end
  while claimed < wanted do
    if claimed > 0 then  -- more than one only from a deep backlog
      if not fetched then fill() end
      if not deep then break end
    end
    local task, task_entry, payload, prio = pick()
    if not task then break end
    taken[task] = true
    local data = cmsgpack.pack({1, 'C', tonumber(task), ARGV[12], tonumber(ARGV[14]),
                                tonumber(ARGV[13])})
    local c = fold_in(data, 'C', task, ARGV[12], ARGV[13], '', '', '', task_entry, prio)
    if c.err then return c end
    if claimed == 0 then
      reply[4], reply[5], reply[6], reply[7], reply[8] = c[1], c[2], c[3], task, payload or ''
    else
      local n = #more
      more[n + 1], more[n + 2], more[n + 3], more[n + 4], more[n + 5] =
        c[1], c[2], c[3], task, payload or ''
    end
    claimed = claimed + 1
  end
end
if claimed == 0 then  -- nothing claimed: how far the tasks were read, and when to look again
  reply[9] = get_meta().tasks or ''
  local soonest = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
  local change = nil
  if soonest[1] then
    change = tonumber(soonest[2])
    if withheld then  -- the first lapse not yet due, or the end of the heir's wait
      local later = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. string.format('%d', now),
                               '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
      change = withheld
      if later[1] and tonumber(later[2]) < change then change = tonumber(later[2]) end
    end
  end
  if get_meta().parked then  -- a delay's end is a change too
    local delayed = redis.call('ZRANGE', KEYS[7], 0, 0, 'WITHSCORES')
    if delayed[1] and (not change or tonumber(delayed[2]) < change) then
      change = tonumber(delayed[2])
    end
  end
  if change then reply[10] = string.format('%d', change) else reply[11] = '1' end
  if now then reply[12] = string.format('%d', now) end
end
for _, v in ipairs(more) do reply[#reply + 1] = v end
return save(reply)
