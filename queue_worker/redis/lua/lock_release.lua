-- The checkpoint's lock released (queue_worker.history.redis_checkpoint). KEYS[1] the lock,
-- ARGV[1] the value its holder set: delete it only if it is still that.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
