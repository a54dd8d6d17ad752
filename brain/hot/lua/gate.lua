-- The admission gate of server pools (brain/hot/gate.py; docs/fair-share.md).
-- Gives back the concurrency slots of runs that ended, then moves calls waiting in the lanes'
-- wait lists into their pool queues while every limit of their lane allows. Lanes belong to a
-- group (one user on one pool): groups take turns (round-robin, `weight` calls per turn), and
-- within a group the lane of the highest priority goes first, lanes of one priority (a user's
-- trees) taking turns; oldest first within a lane. A lane with a `window` admits only while its
-- pool queue holds fewer calls than that. Time is Redis's own (TIME), never a caller's clock.
-- ARGV[1] the cancelled set (a cancelled run is dropped, spending no budget)
-- ARGV[2] the most calls to admit in this call (bounds the script's time)
-- ARGV[3] the lease of a slot in ms when a waiting entry names none
-- ARGV[4] '1': push the brain's gate timer awake when calls are left waiting (a caller that
--         is not that timer: it must learn when the next one may go)
-- ARGV[5..] run ids whose slots to give back
-- Returns {admitted, wait_us}: wait_us is when the soonest blocked lane may go (-1: none waits,
-- or only behind a full queue window: a run's end runs the gate again, the timer's poll too).
redis.replicate_commands()
local NS = 'vt:gate:'
local LANES, GROUPS, WAITING, HELD = NS .. 'lanes', NS .. 'groups', NS .. 'waiting', NS .. 'held'
local cancelled, budget, default_lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
-- GCRA tolerance: a call may go this early, so a timer a little late loses no rate and a
-- fast limit admits a batch per call; under one interval of any rate below 20/s (no burst).
local TAU = 50000
-- workers.throttle.MAX_PAUSE_S (+1 s of slack), in µs.
local MAX_PAUSE_US = 3601000000
-- brain.core.models.PRIORITY_WORDS["high"]: a lane of this priority or above (with fair share
-- on) puts its calls at the head of the pool queue.
local HIGH = 8
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

for i = 5, #ARGV do
  local run = ARGV[i]
  local held = redis.call('HGET', HELD, run)
  if held then
    for key in string.gmatch(held, '[^\n]+') do
      redis.call('ZREM', NS .. 'slots:' .. key, run)
    end
    redis.call('HDEL', HELD, run)
  end
end

-- A lane moves calls into a server pool's queue, from its own wait list, and nowhere else: a
-- pool's Redis user may write lanes, and the brain (who may write any key) runs this script
-- too, so a forged lane must not reach a client's queue or any other key (docs/security.md).
local WAIT_NS = NS .. 'w:'
local function usable(queue, wait)
  if not (queue == 'server' or string.match(queue, '^server%.[%w_%-]+$')) then return false end
  return string.sub(wait, 1, #WAIT_NS) == WAIT_NS and string.sub(wait, -(#queue + 1)) == ':' .. queue
end

local groups, by_group, queues = {}, {}, {}
local lane_list = redis.call('ZRANGE', LANES, 0, -1, 'WITHSCORES')
for j = 1, #lane_list, 2 do
  local id = lane_list[j]
  local meta = redis.call('HMGET', NS .. 'lane:' .. id, 'queue', 'wait', 'limits', 'group', 'weight',
    'priority', 'window', 'window_why')
  local ok, limits = pcall(cjson.decode, meta[3] or '')
  if meta[1] and meta[2] and ok and type(limits) == 'table' and usable(meta[1], meta[2]) then
    local lane = {id = id, queue = meta[1], wait = meta[2], limits = limits,
      score = tonumber(lane_list[j + 1]), priority = tonumber(meta[6] or '') or 5,
      window = tonumber(meta[7] or '') or 0, window_why = meta[8] or ''}
    queues[lane.queue] = true
    local name = meta[4] or id
    local group = by_group[name]
    if not group then
      -- 1-100 as the setting allows (a lane a pool forged gets no bigger share than a user's).
      group = {name = name, lanes = {}, weight = math.min(100, math.max(1, math.floor(tonumber(meta[5] or '') or 1)))}
      group.score = tonumber(redis.call('ZSCORE', GROUPS, name) or '0')
      by_group[name] = group
      table.insert(groups, group)
    end
    table.insert(group.lanes, lane)
  else
    redis.call('ZREM', LANES, id)
  end
end
-- A publisher writes every gated call of a pool queue to that queue's inbox (one kombu key
-- prefix for all lanes: no Redis connection per lane, which was one per tree with fair share
-- on). Each goes to the wait list of the lane its run was recorded in (Gate.enqueue wrote the
-- lane and the run before the message), oldest first, so a lane keeps its order. A run no
-- longer recorded as waiting (cancelled, or re-sent as a new run) is dropped: the store is the
-- record, and the reconciler re-sends a run whose message is nowhere.
local INBOX = NS .. 'w:in:'
local drained = 0
local function run_of(raw)
  local ok, msg = pcall(cjson.decode, raw)
  if ok and type(msg) == 'table' and type(msg.headers) == 'table' and type(msg.headers.id) == 'string' then
    return msg.headers.id
  end
  return nil
end
for queue, _ in pairs(queues) do
  while drained < budget do
    local raw = redis.call('RPOP', INBOX .. queue)
    if not raw then break end
    drained = drained + 1
    local run = run_of(raw)
    local entry = run and redis.call('HGET', WAITING, run)
    local lane_id = entry and string.match(entry, '^([^\t]+)')
    local wait = lane_id and redis.call('HGET', NS .. 'lane:' .. lane_id, 'wait')
    if wait and usable(queue, wait) then
      redis.call('LPUSH', wait, raw)
    elseif not run then
      -- Not a task message of ours: into the pool queue, where the guarded transport drops it.
      redis.call('LPUSH', queue, raw)
    end
  end
end

-- Highest priority first, then the lane served longest ago (a user's trees take turns).
local function lane_order(a, b)
  if a.priority ~= b.priority then return a.priority > b.priority end
  if a.score ~= b.score then return a.score < b.score end
  return a.id < b.id
end
for _, group in ipairs(groups) do table.sort(group.lanes, lane_order) end
table.sort(groups, function(a, b)
  if a.score ~= b.score then return a.score < b.score end
  return a.name < b.name
end)

local admitted, wait_us = 0, -1
local function note_wait(us)
  if us < 0 then us = 0 end
  if wait_us < 0 or us < wait_us then wait_us = us end
end

-- Why the head of a lane may not go now (nil: it may), noting when it may; blocked_key is
-- the limit key that holds it (status counts what waits on each limit).
local blocked_key = ''
local function blocked_by(lane)
  for _, l in ipairs(lane.limits) do
    local key, interval, cap = l[1], tonumber(l[2]), tonumber(l[3])
    blocked_key = key
    -- A server that answered 429 with Retry-After: nothing of its budget until then (pause.lua
    -- writes "<until µs>\t<why>"). A lane may carry a limit key for its pause alone (0, 0).
    -- A pause over an hour ahead (MAX_PAUSE_S) was not written by pause.lua: ignored.
    local until_us, why = string.match(redis.call('GET', NS .. 'pause:' .. key) or '', '^(%d+)\t(.*)$')
    until_us = tonumber(until_us)
    if until_us and until_us > now and until_us - now <= MAX_PAUSE_US then
      note_wait(until_us - now)
      return why
    end
    if interval > 0 then
      local tat = tonumber(redis.call('GET', NS .. 'rate:' .. key) or '0')
      if tat - now > TAU then
        note_wait(tat - TAU - now)
        return l[4]
      end
    end
    if cap > 0 then
      local slots = NS .. 'slots:' .. key
      redis.call('ZREMRANGEBYSCORE', slots, '-inf', now) -- leases of runs that never gave back
      if redis.call('ZCARD', slots) >= cap then
        local first = redis.call('ZRANGE', slots, 0, 0, 'WITHSCORES')
        if first[2] then note_wait(tonumber(first[2]) - now) end
        return l[5]
      end
    end
  end
  return nil
end

local function admit(lane, run)
  local entry = redis.call('HGET', WAITING, run)
  local lease = default_lease
  if entry then
    local _, _, ms = string.find(entry, '\t(%d+)$')
    if ms then lease = tonumber(ms) end
  end
  local slots = {}
  local second = math.floor(now / 1000000)
  for _, l in ipairs(lane.limits) do
    local key, interval, cap = l[1], tonumber(l[2]), tonumber(l[3])
    -- Calls admitted per second, the last few seconds only: `status --queues` shows the
    -- current rate from it (brain.hot.gate.Gate.limit_view); a key idle for 15 s vanishes.
    local admits = NS .. 'admits:' .. key
    redis.call('HINCRBY', admits, second, 1)
    redis.call('HDEL', admits, second - 12)
    redis.call('PEXPIRE', admits, 15000)
    if interval > 0 then
      local k = NS .. 'rate:' .. key
      local tat = tonumber(redis.call('GET', k) or '0')
      if tat < now then tat = now end
      tat = tat + interval
      redis.call('SET', k, string.format('%d', tat), 'PX', math.floor((tat - now) / 1000) + 60000)
    end
    if cap > 0 then
      redis.call('ZADD', NS .. 'slots:' .. key, now + lease * 1000, run)
      table.insert(slots, key)
    end
  end
  if #slots > 0 then redis.call('HSET', HELD, run, table.concat(slots, '\n')) end
  if lane.priority >= HIGH and lane.window > 0 then
    -- A high-priority call (a person waits for it) goes to the head of its pool's queue:
    -- workers pop from the right, so it is the next one taken, not behind the window.
    redis.call('RPUSH', lane.queue, redis.call('RPOP', lane.wait))
  else
    redis.call('RPOPLPUSH', lane.wait, lane.queue)
  end
  redis.call('HDEL', WAITING, run)
end

-- Calls in each pool queue now (read once, counted up as calls are admitted into it).
local queued = {}
local function window_full(lane, its_turn)
  if lane.window <= 0 then return false end
  if queued[lane.queue] == nil then queued[lane.queue] = redis.call('LLEN', lane.queue) end
  -- A high call of the group whose turn it is (served longest ago, not yet in this call) may
  -- go one past the window, to the head of the queue: a person waiting takes the next worker
  -- to free up, instead of waiting for a run to end before being admitted. One past at most,
  -- and only on its group's turn, so the other groups' calls still alternate with its own.
  if its_turn and lane.priority >= HIGH then return queued[lane.queue] >= lane.window + 1 end
  return queued[lane.queue] >= lane.window
end

-- Served lanes and groups get scores past `now` in the order served (seq), so the next call
-- of this script goes on where this one stopped.
local seq = 0
local progress = true
-- Dropping a cancelled run is a step too: a cancelled 100,000-call tree is drained over many
-- short calls, never in one that would stall Redis for everyone.
local steps, max_steps = 0, budget * 4
while progress and admitted < budget and steps < max_steps do
  progress = false
  for index, group in ipairs(groups) do
    local turns = group.weight
    while turns > 0 and admitted < budget and steps < max_steps do
      local lane = nil
      for _, candidate in ipairs(group.lanes) do
        if not candidate.stopped then lane = candidate; break end
      end
      if not lane then break end
      steps = steps + 1
      local raw = redis.call('LINDEX', lane.wait, -1)
      if not raw then
        lane.stopped = true
        -- Kept while fresh: a lane is recorded before its calls' messages are written.
        if redis.call('EXISTS', NS .. 'fresh:' .. lane.id) == 0 then
          redis.call('ZREM', LANES, lane.id)
          redis.call('DEL', NS .. 'lane:' .. lane.id)
        end
      else
        local ok, msg = pcall(cjson.decode, raw)
        local run = ok and type(msg) == 'table' and type(msg.headers) == 'table' and msg.headers.id or nil
        if type(run) ~= 'string' then
          -- Not a task message of ours: into the pool queue, where the guarded transport drops it.
          redis.call('RPOPLPUSH', lane.wait, lane.queue)
          progress = true
        elseif redis.call('SISMEMBER', cancelled, run) == 1 then
          redis.call('RPOP', lane.wait)
          redis.call('HDEL', WAITING, run)
          progress = true
        elseif window_full(lane, index == 1 and not group.served) then
          -- No wait noted: the end of a run of that pool runs this script again.
          lane.stopped = true
          redis.call('HSET', NS .. 'lane:' .. lane.id, 'why', lane.window_why, 'why_key', '')
        else
          local why = blocked_by(lane)
          if why then
            lane.stopped = true
            redis.call('HSET', NS .. 'lane:' .. lane.id, 'why', why, 'why_key', blocked_key)
          else
            admit(lane, run)
            admitted = admitted + 1
            if queued[lane.queue] ~= nil then queued[lane.queue] = queued[lane.queue] + 1 end
            progress = true
            turns = turns - 1
            group.served = true
            seq = seq + 1
            lane.score = now + seq
            group.score = now + seq
            redis.call('ZADD', LANES, lane.score, lane.id) -- served: behind its group's others
            redis.call('ZADD', GROUPS, group.score, group.name)
            table.sort(group.lanes, lane_order)
          end
        end
      end
    end
  end
end
-- A group with no lane left is forgotten (its score only orders groups that wait).
for _, group in ipairs(groups) do
  local left = false
  for _, lane in ipairs(group.lanes) do
    if redis.call('EXISTS', NS .. 'lane:' .. lane.id) == 1 then left = true; break end
  end
  if not left then redis.call('ZREM', GROUPS, group.name) end
end
if admitted >= budget or steps >= max_steps or drained >= budget then wait_us = 0 end
if ARGV[4] == '1' and wait_us >= 0 then
  redis.call('LPUSH', NS .. 'wake', '1')
  redis.call('LTRIM', NS .. 'wake', 0, 0)
end
return {admitted, wait_us}
