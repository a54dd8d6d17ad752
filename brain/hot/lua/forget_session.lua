-- Forget a client's session only if it is still the one the caller read (compare-and-delete):
-- of two brains that both saw its heartbeat lapse, one takes it back; a session the client
-- announced meanwhile (through another brain) is never dropped in the old one's place.
-- KEYS: the presence hash, the last-seen hash, the session's user's index of client ids
-- ARGV: the client id, its session as read (JSON), when it was last seen
-- Returns 1 when this call forgot it, else 0.
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
if KEYS[3] then
  redis.call('SREM', KEYS[3], ARGV[1])
end
return 1
