-- After a result is recorded: drop the run's running mark, only if it is this run's (a
-- newer attempt keeps its own), then wake the tree's watchers. One round trip.
-- KEYS: the tree's running hash (under the client's prefix for a client's run)
-- ARGV: task id, run id as JSON, the tree's events channel
-- Marks are written with json.dumps, whose '"run_id": "<id>"' is matched literally (run
-- ids are [A-Za-z0-9._-], nothing json.dumps would escape).
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local cleared = 0
if raw and string.find(raw, '"run_id": ' .. ARGV[2], 1, true) then
  cleared = redis.call('HDEL', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', ARGV[3], '1')
return cleared
