-- The sessions of one user's clients, and of one more client (a tree's own), in one read; an
-- id in the index whose session is gone is dropped from it here, where no connect can come
-- between the read and the drop (a connect writes its session and its index entry in one MULTI).
-- KEYS: the presence hash, the user's index of client ids (brain.hot.presence)
-- ARGV: one more client id, or ''
-- Returns {id, session or false, id, session or false, ...}; {} when the presence key is not
-- a hash (another party made it something else: no hash, no session).
local ids = redis.call('SMEMBERS', KEYS[2])
local indexed = #ids
if ARGV[1] ~= '' then
  table.insert(ids, ARGV[1])
end
if #ids == 0 then
  return {}
end
-- HMGET in slices: Lua's unpack fails past ~8,000 values ("too many results to unpack"), and
-- a user may have more clients than that.
local found = {}
local SLICE = 1000
for first = 1, #ids, SLICE do
  local got = redis.pcall('HMGET', KEYS[1], unpack(ids, first, math.min(first + SLICE - 1, #ids)))
  if type(got) == 'table' and got['err'] then
    return {}
  end
  for j = 1, #got do
    found[first + j - 1] = got[j]
  end
end
local out = {}
for i, id in ipairs(ids) do
  out[2 * i - 1] = id
  out[2 * i] = found[i]
  if i <= indexed and not found[i] then
    redis.call('SREM', KEYS[2], id)
  end
end
return out
