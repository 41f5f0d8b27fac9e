-- Append a session's events atomically, if and only if nobody appended since
-- the state the caller decided on, and the idempotency key of the command was
-- not already used. Everything else it writes was computed by the caller from
-- the events (snapshot, mail items, wake triggers, indexes); it decides nothing.
--
-- "Since the state the caller decided on" is checked with an etag, a value
-- unique to each append, not with the version number: a worker that chains
-- several appends in one pipeline must fail the later ones if an earlier one
-- did not apply, even when another worker's append brought the version to
-- the number it expected.
--
-- KEYS: 1 stream, 2 state hash (version, snapshot), 3 pending-mail hash,
--       4 the sender's idempotency hash (one field per tool call, no expiry), 5 tree handles hash, 6 tree members set,
--       7 partition wake stream, 8 partition sessions set, 9 partition feed,
--       10 partition approvals hash, 11 tree grants set, 12 the session's due-mail hash (the items a claim
--       may take; the pending-mail hash holds the rest), 13 partition due index, 14 partition outbound index,
--       then per companion its stream, its state hash, its pending-mail hash and its due-mail hash
--       (all in one hash slot: the tree's partition tag)
-- ARGV: 1 expected etag ('' for a new session) and new etag as "old new", 2 snapshot json,
--       3 idempotency record ('' none), 4 its field (the tool call's digest, ``compact.record_field``),
--       5 the session's registration: '' none, '*' without a handle, else the handle to reserve,
--       6 session id, 7 event count, then (type, data) per event,
--       then mail change count, then (message id, item json or '' to delete, where it goes: 'due' or 'held',
--       or 'new due' / 'new held' for an item these events create, which is in neither hash yet),
--       then wake count, then one wake trigger json each,
--       then approval index count, then (field, value) each,
--       then tree grant count, then one label each,
--       then the feed's approximate max length,
--       then the due index operation ('', 'set', 'lt', 'del') and score,
--       then companion count, then per companion: etag "old new", snapshot json, session id,
--       its name in the feed, event count, (type, data) per event, outbound index count, (field, value) each,
--       mail change count, (message id, item json, where) each, wake count, one trigger each,
--       the due index operation and score (a notice on a parent's stream is mail like any other),
--       then the session's own outbound index count, (field, value) each (its own records: a peer intent,
--       and the receipt, refusal and settlement a peer driver records on it),
--       then the record's field as an earlier version wrote it ('' none),
--       then the session's name in the feed (``compact.id_bytes``),
--       then the answer to push once applied ('' none), its list's lifetime, the command group and the
--       command's entry id to acknowledge,
--       then whether the decision read the service as draining ('1', '0', or '' if it read nothing of it),
--       and last the protocol version every entry carries (`v`)
-- The last KEY is the partition's copy of the service-wide drain flag (after the companions' keys); with an
-- answer, the two before it are the producer's reply list and the command stream (one server only).
if ARGV[3] ~= '' then
  -- Under its field, or under the field an earlier version wrote it in (the digest's text).
  local existing = redis.call('HMGET', KEYS[4], ARGV[4], ARGV[#ARGV - 7])
  if existing[1] or existing[2] then return {'dup', existing[1] or existing[2]} end
end
local state = redis.call('HMGET', KEYS[2], 'version', 'etag')
local current = tonumber(state[1] or '0')
local space = string.find(ARGV[1], ' ', 1, true)
local expected_etag = string.sub(ARGV[1], 1, space - 1)
if (state[2] or '') ~= expected_etag then return {'conflict', tostring(current)} end
-- The drain flag the decision read is part of the state it decided on: a drain that began since is a conflict.
local drain_read = ARGV[#ARGV - 1]
if drain_read ~= '' and tostring(redis.call('EXISTS', KEYS[#KEYS])) ~= drain_read then
  return {'conflict', tostring(current)}
end

-- Companions (exact source capacity): other sessions of the partition the same decision appends to (a sender's
-- record of the message its recipient accepted or settled). Every etag is checked before anything
-- is written, so the step applies whole or not at all.
local function companions_start()
  local j = 8 + 2 * tonumber(ARGV[7])
  j = j + 1 + 3 * tonumber(ARGV[j])
  j = j + 1 + tonumber(ARGV[j])
  j = j + 1 + 2 * tonumber(ARGV[j])
  j = j + 1 + tonumber(ARGV[j])
  return j + 3
end
local companions = {}
local c = companions_start()
for n = 1, tonumber(ARGV[c]) do
  c = c + 1
  local cstate = redis.call('HMGET', KEYS[12 + 4 * n], 'version', 'etag')
  local cspace = string.find(ARGV[c], ' ', 1, true)
  if (cstate[2] or '') ~= string.sub(ARGV[c], 1, cspace - 1) then return {'conflict', tostring(current)} end
  companions[n] = {at = c, version = tonumber(cstate[1] or '0'), etag = string.sub(ARGV[c], cspace + 1)}
  c = c + 4
  c = c + 2 * tonumber(ARGV[c]) + 1
  c = c + 2 * tonumber(ARGV[c]) + 1
  c = c + 3 * tonumber(ARGV[c]) + 1
  -- past the wake triggers, onto the due score (the due operation comes before it)
  c = c + tonumber(ARGV[c]) + 2
end
if ARGV[5] ~= '' then
  if ARGV[5] ~= '*' and redis.call('HSETNX', KEYS[5], ARGV[5], ARGV[6]) == 0 then return {'handle_taken', ''} end
  redis.call('SADD', KEYS[6], ARGV[6])
  redis.call('SADD', KEYS[8], ARGV[6])
end
local protocol = ARGV[#ARGV]
local i = 8
local version = current
for _ = 1, tonumber(ARGV[7]) do
  version = version + 1
  -- The entry id is the event's position: readers address events by version.
  redis.call('XADD', KEYS[1], version .. '-0', 'type', ARGV[i], 'data', ARGV[i + 1], 'v', protocol)
  i = i + 2
end
redis.call('HSET', KEYS[2], 'version', version, 'snapshot', ARGV[2], 'etag', string.sub(ARGV[1], space + 1))
local changes = tonumber(ARGV[i])
i = i + 1
-- An item lives in one of two hashes: the due hash while a claim may take it, the pending-mail hash
-- otherwise. One copy, and a new message costs one write.
for _ = 1, changes do
  local message_id, item, where = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if item == '' then
    redis.call('HDEL', KEYS[3], message_id)
    redis.call('HDEL', KEYS[12], message_id)
  elseif where == 'new due' then
    redis.call('HSET', KEYS[12], message_id, item)
  elseif where == 'new held' then
    redis.call('HSET', KEYS[3], message_id, item)
  elseif where == 'due' then
    redis.call('HSET', KEYS[12], message_id, item)
    redis.call('HDEL', KEYS[3], message_id)
  else
    redis.call('HSET', KEYS[3], message_id, item)
    redis.call('HDEL', KEYS[12], message_id)
  end
  i = i + 3
end
local wakes = tonumber(ARGV[i])
i = i + 1
for _ = 1, wakes do
  -- In the same step as the event: a wake is never requested without its trigger.
  redis.call('XADD', KEYS[7], '*', 'session', ARGV[6], 'data', ARGV[i], 'v', protocol)
  i = i + 1
end
local approvals = tonumber(ARGV[i])
i = i + 1
for _ = 1, approvals do
  redis.call('HSET', KEYS[10], ARGV[i], ARGV[i + 1])
  i = i + 2
end
local grants = tonumber(ARGV[i])
i = i + 1
for _ = 1, grants do
  redis.call('SADD', KEYS[11], ARGV[i])
  i = i + 1
end
-- The partition feed lets projections follow every session of the partition
-- through one stream: one entry per step, naming each session the step appended to
-- and the positions it appended there ("7", or "7-9" for several). It carries no copy
-- of the events, nor their types: readers take those from the session streams (feed.py).
local feed_maxlen = ARGV[i]
local feed = {'v', protocol}
local events = tonumber(ARGV[7])
if events == 1 then
  feed[3], feed[4] = ARGV[#ARGV - 6], version
elseif events > 1 then
  feed[3], feed[4] = ARGV[#ARGV - 6], (current + 1) .. '-' .. version
end

-- Mail as an obligation: when the delivery pump must next look at this session (the commit plan computes it).
local due_op = ARGV[i + 1]
if due_op == 'set' then
  redis.call('ZADD', KEYS[13], ARGV[i + 2], ARGV[6])
elseif due_op == 'lt' then
  redis.call('ZADD', KEYS[13], 'LT', ARGV[i + 2], ARGV[6])
elseif due_op == 'del' then
  redis.call('ZREM', KEYS[13], ARGV[6])
end
for n, companion in ipairs(companions) do
  local k = companion.at
  local csid = ARGV[k + 2]
  local cversion = companion.version
  local ccount = tonumber(ARGV[k + 4])
  if ccount > 0 then
    feed[#feed + 1] = ARGV[k + 3]
    feed[#feed + 1] = ccount == 1 and (cversion + 1) or (cversion + 1) .. '-' .. (cversion + ccount)
  end
  k = k + 5
  for _ = 1, ccount do
    cversion = cversion + 1
    redis.call('XADD', KEYS[11 + 4 * n], cversion .. '-0', 'type', ARGV[k], 'data', ARGV[k + 1], 'v', protocol)
    k = k + 2
  end
  redis.call('HSET', KEYS[12 + 4 * n], 'version', cversion, 'snapshot', ARGV[companion.at + 1], 'etag', companion.etag)
  for _ = 1, tonumber(ARGV[k]) do
    redis.call('HSET', KEYS[14], ARGV[k + 1], ARGV[k + 2])
    k = k + 2
  end
  k = k + 1
  -- A notice is new mail on the companion: one copy, in the hash it belongs in.
  local cmail, cdue = KEYS[13 + 4 * n], KEYS[14 + 4 * n]
  for _ = 1, tonumber(ARGV[k]) do
    local message_id, item, where = ARGV[k + 1], ARGV[k + 2], ARGV[k + 3]
    if item == '' then
      redis.call('HDEL', cmail, message_id)
      redis.call('HDEL', cdue, message_id)
    elseif string.find(where, 'held', 1, true) then
      redis.call('HSET', cmail, message_id, item)
      if where == 'held' then redis.call('HDEL', cdue, message_id) end
    else
      redis.call('HSET', cdue, message_id, item)
      if where == 'due' then redis.call('HDEL', cmail, message_id) end
    end
    k = k + 3
  end
  k = k + 1
  for _ = 1, tonumber(ARGV[k]) do
    redis.call('XADD', KEYS[7], '*', 'session', csid, 'data', ARGV[k + 1], 'v', protocol)
    k = k + 1
  end
  local cdue_op, cdue_at = ARGV[k + 1], ARGV[k + 2]
  if cdue_op == 'set' then
    redis.call('ZADD', KEYS[13], cdue_at, csid)
  elseif cdue_op == 'lt' then
    redis.call('ZADD', KEYS[13], 'LT', cdue_at, csid)
  elseif cdue_op == 'del' then
    redis.call('ZREM', KEYS[13], csid)
  end
end
if #feed > 2 then redis.call('XADD', KEYS[9], 'MAXLEN', '~', feed_maxlen, '*', unpack(feed)) end
local own = c + 1
for n = 1, tonumber(ARGV[own]) do
  redis.call('HSET', KEYS[14], ARGV[own + 2 * n - 1], ARGV[own + 2 * n])
end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[4], ARGV[4], ARGV[3]) end
-- The producer's answer and the command's acknowledgement, in the same step as the decision they report
-- (one server, fast profile): the answer exists exactly when the append does, one round trip sooner.
local answer = ARGV[#ARGV - 5]
if answer ~= '' then
  redis.call('LPUSH', KEYS[#KEYS - 2], answer)
  redis.call('EXPIRE', KEYS[#KEYS - 2], ARGV[#ARGV - 4])
  redis.call('XACK', KEYS[#KEYS - 1], ARGV[#ARGV - 3], ARGV[#ARGV - 2])
end
return {'ok', tostring(version)}
