-- queue_refused(identity key, queue id): nil while the key holds the queue id the handle
-- opened ('' for a handle opened without its queue: nothing to check), else the error to
-- answer. Run first by every script that reads or appends: a server reset (restarted
-- without persistence, flushed) is met by the very call that would have read the new
-- server's records or appended to them, not by a look before it.
local function queue_refused(id_key, queue)
  if queue == '' then return nil end
  local found = redis.call('GET', id_key)
  if found == queue then return nil end
  if found then return redis.error_reply('QWQUEUE changed') end
  return redis.error_reply('QWQUEUE missing')
end
