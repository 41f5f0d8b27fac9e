-- Append a session's events atomically, if and only if nobody appended since
-- the state the caller decided on (expected version), and the idempotency key
-- of the command was not already used.
--
-- KEYS: 1 stream, 2 state hash (version, snapshot), 3 pending-mail hash,
--       4 idempotency key, 5 tree handles hash, 6 tree members set
--       (all in one hash slot: the tree's partition tag)
-- ARGV: 1 expected version, 2 snapshot json, 3 idempotency record ('' none),
--       4 idempotency ttl seconds, 5 handle to reserve ('' none), 6 session id,
--       7 event count, then (type, data) per event,
--       then mail change count, then (message id, item json or '' to delete)
if ARGV[3] ~= '' then
  local existing = redis.call('GET', KEYS[4])
  if existing then return {'dup', existing} end
end
local current = tonumber(redis.call('HGET', KEYS[2], 'version') or '0')
if current ~= tonumber(ARGV[1]) then return {'conflict', tostring(current)} end
if ARGV[5] ~= '' then
  if redis.call('HSETNX', KEYS[5], ARGV[5], ARGV[6]) == 0 then return {'handle_taken', ''} end
  redis.call('SADD', KEYS[6], ARGV[6])
end
local i = 8
local version = current
for _ = 1, tonumber(ARGV[7]) do
  version = version + 1
  -- The entry id is the event's position: readers address events by version.
  redis.call('XADD', KEYS[1], version .. '-0', 'type', ARGV[i], 'data', ARGV[i + 1])
  i = i + 2
end
redis.call('HSET', KEYS[2], 'version', version, 'snapshot', ARGV[2])
local changes = tonumber(ARGV[i])
i = i + 1
for _ = 1, changes do
  if ARGV[i + 1] == '' then
    redis.call('HDEL', KEYS[3], ARGV[i])
  else
    redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  end
  i = i + 2
end
if ARGV[3] ~= '' then redis.call('SET', KEYS[4], ARGV[3], 'EX', ARGV[4]) end
return {'ok', tostring(version)}
