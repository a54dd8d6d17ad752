-- One step of a requeue pass (brain.parked.ParkedWork.requeue): renew the lock, drop the
-- chunk handed out last (it has been placed by then) and hand out the next chunk, in one
-- round trip. Only the lock's holder drops refs, so two requeues never drop each other's.
-- KEYS: the list's lock, the list
-- ARGV: this pass's token, lock ms, refs to drop from the head, refs to hand out
-- Returns the refs handed out as one string, one ref per line ('' when the list is empty),
-- or nil when the lock is no longer ours (then nothing is dropped).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return false end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local drop = tonumber(ARGV[3])
if drop > 0 then redis.call('LTRIM', KEYS[2], drop, -1) end
local n = tonumber(ARGV[4])
if n <= 0 then return '' end
return table.concat(redis.call('LRANGE', KEYS[2], 0, n - 1), '\n')
