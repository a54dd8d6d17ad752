-- Take runs out of the cancelled sets (brain.hot.cancelled). KEYS[1] the index (entry -> the
-- time its member was added); ARGV[1] the cut-off: an entry is dropped or kept only if its time
-- is still at or before it (a cancel that added the same member again since keeps it);
-- ARGV[2] the time a kept entry is given; ARGV[3] how many drops follow, as triples (entry,
-- cancelled set, member), then the entries to keep (their run still in a client's keys).
-- SREM by pcall: a client that replaced its own set with another type loses nothing else.
local index, cutoff, now, drops = KEYS[1], tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local dropped, kept = 0, 0
local function due(entry)
  local at = redis.call('ZSCORE', index, entry)
  return at and tonumber(at) <= cutoff
end
for i = 4, 3 + 3 * drops, 3 do
  local entry = ARGV[i]
  if due(entry) then
    redis.pcall('SREM', ARGV[i + 1], ARGV[i + 2])
    redis.call('ZREM', index, entry)
    dropped = dropped + 1
  end
end
for i = 4 + 3 * drops, #ARGV do
  if due(ARGV[i]) then
    redis.call('ZADD', index, 'XX', now, ARGV[i])
    kept = kept + 1
  end
end
return {dropped, kept}
