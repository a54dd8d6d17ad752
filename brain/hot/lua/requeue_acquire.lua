-- Begin a requeue pass over one parked list (brain.parked.ParkedWork.requeue): take the
-- list's lock, clear its "again" flag and record the requeue as begun (the reconciler
-- finishes one a crash left behind). When another requeue holds the lock, ask that holder
-- for one more pass instead.
-- KEYS: the list's lock, its again flag, the hash of requeues begun, the list
-- ARGV: a token naming this pass, lock ms, the list's key, the client id
-- Returns the number of refs this pass covers (the list's length now), or -1 when the
-- list is taken by another requeue.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('DEL', KEYS[2])
  redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
  return redis.call('LLEN', KEYS[4])
end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
return -1
