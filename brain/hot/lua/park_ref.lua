-- List one parked ref for its owner, keeping the list in parked_at order (brain.parked).
-- Appends when the ref is not older than the tail (the usual case, O(1)) or while a requeue
-- holds the list (it drops handed-out refs by position from the head, so nothing may be
-- inserted before them); else binary-searches its place (LINDEX) and inserts it.
-- KEYS: the parked list, its requeue lock
-- ARGV: the encoded ref, its parked_at
-- Returns the list's new length.

-- parked_at of a stored ref: the compact form starts with it; a ref in the older JSON form
-- (written before that format) is decoded.
local function parked_at(v)
  if string.sub(v, 1, 1) == '{' then
    local ok, d = pcall(cjson.decode, v)
    if ok and type(d) == 'table' then return tonumber(d['parked_at']) or 0 end
    return 0
  end
  return tonumber(string.match(v, '^[^ ]*')) or 0
end

local t = tonumber(ARGV[2])
local n = redis.call('LLEN', KEYS[1])
if n == 0 or redis.call('EXISTS', KEYS[2]) == 1
    or parked_at(redis.call('LINDEX', KEYS[1], -1)) <= t then
  return redis.call('RPUSH', KEYS[1], ARGV[1])
end
local lo, hi = 0, n - 1
while lo < hi do
  local mid = math.floor((lo + hi) / 2)
  if parked_at(redis.call('LINDEX', KEYS[1], mid)) > t then hi = mid else lo = mid + 1 end
end
return redis.call('LINSERT', KEYS[1], 'BEFORE', redis.call('LINDEX', KEYS[1], lo), ARGV[1])
