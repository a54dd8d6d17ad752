-- One chunk of a parked list in one reply (brain.parked.ParkedWork.refs_in), so that a list
-- is never read whole: the refs from ARGV[1] to ARGV[2] joined by newlines.
-- KEYS: the list
-- ARGV: start, stop (inclusive, as LRANGE)
-- Returns one string, one ref per line ('' past the end).
return table.concat(redis.call('LRANGE', KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])), '\n')
