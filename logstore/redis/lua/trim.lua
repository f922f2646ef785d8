-- The end of a plain trim (logstore.redis.trim.trim), after trim_to_start.lua: returns the
-- entries removed.
return removed
