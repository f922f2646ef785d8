-- The checkpoint's lock renewed (queue_worker.history.redis_checkpoint). KEYS[1] the lock,
-- ARGV[1] the holder's value, ARGV[2] the ttl: renew it if still ours.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
