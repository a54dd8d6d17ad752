-- Pause one limit key's budget (brain.hot.gate.Gate.pause; docs/fair-share.md): a server that
-- answered 429 with Retry-After gets no call from the gate until the time it named. The gate's
-- script (gate.lua) honours the pause key; the paused hash tells dispatchers (a server with no
-- limit of its own is routed through the gate while paused) and `status --queues`.
-- ARGV[1] the limit key ("server:jira", "origin:https://api.example.com:443")
-- ARGV[2] the pause in microseconds, from now on Redis's clock (TIME), never a caller's
-- ARGV[3] why, as status shows it ("paused by HTTP 429 from server jira")
-- Returns the pause's end (µs since the epoch, Redis time): a later pause already set is kept.
redis.replicate_commands()
local NS = 'vt:gate:'
local key, pause_us, why = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local until_us = now + math.floor(pause_us)
local pause_key = NS .. 'pause:' .. key
local old = tonumber(string.match(redis.call('GET', pause_key) or '', '^(%d+)') or '0')
if old >= until_us then return old end
redis.call('SET', pause_key, string.format('%d\t%s', until_us, why), 'PX', math.floor(pause_us / 1000) + 1000)
redis.call('HSET', NS .. 'paused', key, string.format('%d', until_us))
-- Ended pauses leave the hash here (a pause is rare, the hash small).
local all = redis.call('HGETALL', NS .. 'paused')
for i = 1, #all, 2 do
  if tonumber(all[i + 1]) < now then redis.call('HDEL', NS .. 'paused', all[i]) end
end
return until_us
