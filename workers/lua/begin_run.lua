-- Before a worker runs a call: is the run cancelled? count this delivery; mark the run
-- running unless it is over the delivery limit. One round trip instead of three.
-- KEYS: cancelled set, deliveries counter, the tree's running hash
-- ARGV: run id, counter ttl (s), max deliveries, task id, running mark (JSON)
-- Returns -1 when cancelled, else this delivery's number.
-- INCRBY, not INCR: a client agent's ACL user is granted the command redis-py sends.
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return -1 end
local n = redis.call('INCRBY', KEYS[2], 1)
redis.call('EXPIRE', KEYS[2], ARGV[2])
if n <= tonumber(ARGV[3]) then redis.call('HSET', KEYS[3], ARGV[4], ARGV[5]) end
return n
