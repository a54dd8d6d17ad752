-- End a requeue pass (brain.parked.ParkedWork.requeue): drop the last chunk (placed by
-- now); if another requeue asked meanwhile, keep the lock for one more pass, else release
-- the list and strike it from the hash of requeues begun.
-- KEYS: the list's lock, its again flag, the hash of requeues begun, the list
-- ARGV: this pass's token, lock ms, the list's key, refs to drop from the head
-- Returns the length of the next pass, -1 when the list was released, or -2 when the lock
-- was lost (then nothing is dropped).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -2 end
local drop = tonumber(ARGV[4])
if drop > 0 then redis.call('LTRIM', KEYS[4], drop, -1) end
if redis.call('DEL', KEYS[2]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return redis.call('LLEN', KEYS[4])
end
redis.call('DEL', KEYS[1])
redis.call('HDEL', KEYS[3], ARGV[3])
return -1
