-- Before a worker runs a call: is the run cancelled? count this delivery; mark the run
-- running unless it is over the delivery limit. One round trip instead of three.
-- Marks are never deleted one by one (a round trip per result): the hash expires, and the
-- brain deletes it when the tree finishes; readers trust a mark only for the run the store
-- still has in flight (brain.display.shown_state).
-- KEYS: cancelled set, deliveries counter, the tree's running hash
-- ARGV: run id, ttl (s) of the counter and the marks, max deliveries, task id, running mark (JSON)
-- Returns -1 when cancelled, else this delivery's number.
-- INCRBY, not INCR: a client agent's ACL user is granted the command redis-py sends.
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return -1 end
local n = redis.call('INCRBY', KEYS[2], 1)
redis.call('EXPIRE', KEYS[2], ARGV[2])
if n <= tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[3], ARGV[4], ARGV[5])
  redis.call('EXPIRE', KEYS[3], ARGV[2])
end
return n
