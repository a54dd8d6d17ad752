-- The reference pass of bench/requeue.py (requeue_100k's baseline): move the first ARGV[1]
-- refs of each list KEYS[2..] onto the tail of KEYS[1]; called until it moves none. Requeue
-- itself no longer moves refs (brain.parked.ParkedWork.requeue works on each list in place).
-- KEYS: the destination list, then the source lists
-- ARGV: how many refs to take from each source list in this call
-- Returns how many refs were moved.
local moved = 0
for i = 2, #KEYS do
  local items = redis.call('LRANGE', KEYS[i], 0, tonumber(ARGV[1]) - 1)
  if #items > 0 then
    redis.call('RPUSH', KEYS[1], unpack(items))
    redis.call('LTRIM', KEYS[i], #items, -1)
    moved = moved + #items
  end
end
return moved
