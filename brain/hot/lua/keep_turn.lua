-- Take or keep a turn (KEYS[1]) for ARGV[1], for ARGV[2] ms: free, it is taken; held by the
-- same holder, it is renewed; held by another, it is refused. A holder that dies stops
-- renewing, and the next asker gets the turn once its lease has run out.
local holder = redis.call('GET', KEYS[1])
if holder == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
