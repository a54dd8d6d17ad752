-- Release a lock only if this holder still has it (KEYS[1] = the lock, ARGV[1] = its token):
-- a holder whose lock expired must not delete the next holder's.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
