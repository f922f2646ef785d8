-- The tasks the claiming script's cursor passed over without handing them out
-- (next_task.lua), after rules.lua. Every folding script has them (verdict.lua too), since
-- any record that closes a task may let the tasks waiting for it go.
-- KEYS[6] those due, scored by minus their priority (the highest first, then the lowest id,
-- by the member's padded id); KEYS[7] those whose delay is not over, scored by its end;
-- KEYS[8] those waiting for a dependency (a task enqueued with `after=`: its tasks entry's
-- field 'a' holds the ids of earlier tasks, "3,5"), a member under each dependency still
-- open, scored by it, so that a task that closes finds the tasks waiting for it, and only
-- those: no pick and no close looks at the others (docs/protocol.md §4, "Dependencies").
local function member_of(task, entry) return string.format('%020d', tonumber(task)) .. ' ' .. entry end

-- a task due at `nb` (its delay's end; 0: none) of priority `prio`, parked by the time `now`
local function park(task, entry, nb, prio, now)
  local m = get_meta()
  if nb > now then redis.call('ZADD', KEYS[7], nb, member_of(task, entry) .. ' ' .. prio)
  else redis.call('ZADD', KEYS[6], -prio, member_of(task, entry)) end
  if not m.parked then m.parked, m.reparked = true, true end
end

-- the dependencies among `deps` that `task` waits for: those still open (neither done nor
-- dead), when none is dead; nil when it waits for none (all done, or one dead: then it is
-- handed out, and the worker whose claim wins writes its dead FAIL). An id not below the
-- task's own is no dependency: such a record is unreadable, and its claim's winner says so.
local function open_dependencies(task, deps)
  local open = {}
  for d in string.gmatch(deps, '%d+') do
    if tonumber(d) < tonumber(task) then
      local st = load(d)
      if st and st.s == 'x' then return nil end
      if not (st and st.s == 'd') then open[#open + 1] = d end
    end
  end
  if open[1] then return open end
  return nil
end

-- a task's member in KEYS[8] under its dependency `d` (one under each open one: any of
-- them that closes may let it go, as a dead one does at once)
local function waiting_member(task, entry, nb, prio, deps, d)
  -- (%d: a delay's end, ~2^50, would be written as 1.76e+15 by Lua's own `..`)
  return string.format('%s %d %d %s %s', member_of(task, entry), nb, prio, deps, d)
end

-- a task with dependencies, passed by the cursor: parked in KEYS[8] under each one it
-- waits for (true), or not (false: the caller hands it out or parks it as any task)
local function wait(task, entry, nb, prio, deps)
  local open = open_dependencies(task, deps)
  if not open then return false end
  local args = {}
  for _, d in ipairs(open) do
    args[#args + 1] = d
    args[#args + 1] = waiting_member(task, entry, nb, prio, deps, d)
  end
  redis.call('ZADD', KEYS[8], unpack(args))
  local m = get_meta()
  if not m.after then m.after, m.reafter = true, true end
  return true
end

-- the tasks waiting for one this call closed (rules.lua's `closed`, noted only while some
-- task waits: `~after`): one that waits no more (its dependencies all done, or one dead)
-- leaves KEYS[8] (its members under the others too) and is parked as the cursor parks a
-- task, by the time of the record that closed the last; the others stay under the
-- dependencies still open
local function wake()
  if not closed[1] then return end
  local woken = false
  for _, t in ipairs(closed) do
    local waiting = redis.call('ZRANGEBYSCORE', KEYS[8], t, t)
    if waiting[1] then
      redis.call('ZREMRANGEBYSCORE', KEYS[8], t, t)
      woken = true
      for _, member in ipairs(waiting) do
        local padded, entry, nb, prio, deps =
          string.match(member, '^(%d+) (%S+) (%-?%d+) (%-?%d+) (%S+) %d+$')
        local task = string.format('%d', tonumber(padded))
        nb, prio = tonumber(nb), tonumber(prio)
        if not open_dependencies(task, deps) then
          local others = {}
          for d in string.gmatch(deps, '%d+') do
            if d ~= t then others[#others + 1] = waiting_member(task, entry, nb, prio, deps, d) end
          end
          if others[1] then redis.call('ZREM', KEYS[8], unpack(others)) end
          park(task, entry, nb, prio, closed_at)
        end
      end
    end
  end
  closed = {}
  if woken and redis.call('ZCARD', KEYS[8]) == 0 then
    local m = get_meta()
    m.after, m.reafter = false, true
  end
end
