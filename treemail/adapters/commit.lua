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
-- ARGV: by section, ARGV[1] giving where each begins (commitargs.py lays them out and says what each holds).
-- The last KEY is the partition's copy of the service-wide drain flag (after the companions' keys); with an
-- answer, the two before it are the producer's reply list and the command stream (one server only).
local SECTIONS = {'etags', 'snapshot', 'record', 'record_field', 'legacy_field', 'registration', 'session',
  'feed_name', 'feed_maxlen', 'due_op', 'due_at', 'answer', 'answer_ttl', 'command_group', 'entry_id', 'drain_read',
  'protocol', 'events', 'mail', 'wakes', 'approvals', 'grants', 'outbound', 'companions'}
local COMPANION_SECTIONS = {'etags', 'snapshot', 'session', 'feed_name', 'due_op', 'due_at', 'events', 'outbound',
  'mail', 'wakes'}
-- A header (positions as 4-byte little-endian integers, commitargs.py) -> where each named section begins.
local function sections(header, names)
  local at = {}
  local starts = {struct.unpack('<' .. string.rep('I4', #names), header)}
  for n, name in ipairs(names) do at[name] = starts[n] end
  return at
end
local at = sections(ARGV[1], SECTIONS)

local sid = ARGV[at.session]
if ARGV[at.record] ~= '' then
  -- Under its field, or under the field an earlier version wrote it in (the digest's text).
  local existing = redis.call('HMGET', KEYS[4], ARGV[at.record_field], ARGV[at.legacy_field])
  if existing[1] or existing[2] then return {'dup', existing[1] or existing[2]} end
end
local state = redis.call('HMGET', KEYS[2], 'version', 'etag')
local current = tonumber(state[1] or '0')
local etags = ARGV[at.etags]
local space = string.find(etags, ' ', 1, true)
if (state[2] or '') ~= string.sub(etags, 1, space - 1) then return {'conflict', tostring(current)} end
-- The drain flag the decision read is part of the state it decided on: a drain that began since is a conflict.
local drain_read = ARGV[at.drain_read]
if drain_read ~= '' and tostring(redis.call('EXISTS', KEYS[#KEYS])) ~= drain_read then
  return {'conflict', tostring(current)}
end

-- Companions (exact source capacity): other sessions of the partition the same decision appends to (a sender's
-- record of the message its recipient accepted or settled). Every etag is checked before anything
-- is written, so the step applies whole or not at all.
local companions = {}
for n = 1, tonumber(ARGV[at.companions]) do
  local cat = sections(ARGV[at.companions + n], COMPANION_SECTIONS)
  local cstate = redis.call('HMGET', KEYS[12 + 4 * n], 'version', 'etag')
  local cetags = ARGV[cat.etags]
  local cspace = string.find(cetags, ' ', 1, true)
  if (cstate[2] or '') ~= string.sub(cetags, 1, cspace - 1) then return {'conflict', tostring(current)} end
  companions[n] = {at = cat, version = tonumber(cstate[1] or '0'), etag = string.sub(cetags, cspace + 1)}
end
local registration = ARGV[at.registration]
if registration ~= '' then
  if registration ~= '*' and redis.call('HSETNX', KEYS[5], registration, sid) == 0 then return {'handle_taken', ''} end
  redis.call('SADD', KEYS[6], sid)
  redis.call('SADD', KEYS[8], sid)
end
local protocol = ARGV[at.protocol]
local events = tonumber(ARGV[at.events])
local i = at.events + 1
local version = current
for _ = 1, events do
  version = version + 1
  -- The entry id is the event's position: readers address events by version.
  redis.call('XADD', KEYS[1], version .. '-0', 'type', ARGV[i], 'data', ARGV[i + 1], 'v', protocol)
  i = i + 2
end
redis.call('HSET', KEYS[2], 'version', version, 'snapshot', ARGV[at.snapshot], 'etag', string.sub(etags, space + 1))
i = at.mail + 1
-- An item lives in one of two hashes: the due hash while a claim may take it, the pending-mail hash
-- otherwise. One copy, and a new message costs one write.
for _ = 1, tonumber(ARGV[at.mail]) do
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
for n = 1, tonumber(ARGV[at.wakes]) do
  -- In the same step as the event: a wake is never requested without its trigger.
  redis.call('XADD', KEYS[7], '*', 'session', sid, 'data', ARGV[at.wakes + n], 'v', protocol)
end
i = at.approvals + 1
for _ = 1, tonumber(ARGV[at.approvals]) do
  redis.call('HSET', KEYS[10], ARGV[i], ARGV[i + 1])
  i = i + 2
end
for n = 1, tonumber(ARGV[at.grants]) do
  redis.call('SADD', KEYS[11], ARGV[at.grants + n])
end
-- The partition feed lets projections follow every session of the partition
-- through one stream: one entry per step, naming each session the step appended to
-- and the positions it appended there ("7", or "7-9" for several). It carries no copy
-- of the events, nor their types: readers take those from the session streams (feed.py).
local feed = {'v', protocol}
if events == 1 then
  feed[3], feed[4] = ARGV[at.feed_name], version
elseif events > 1 then
  feed[3], feed[4] = ARGV[at.feed_name], (current + 1) .. '-' .. version
end

-- Mail as an obligation: when the delivery pump must next look at this session (the commit plan computes it).
local due_op, due_at = ARGV[at.due_op], ARGV[at.due_at]
if due_op == 'set' then
  redis.call('ZADD', KEYS[13], due_at, sid)
elseif due_op == 'lt' then
  redis.call('ZADD', KEYS[13], 'LT', due_at, sid)
elseif due_op == 'del' then
  redis.call('ZREM', KEYS[13], sid)
end
for n, companion in ipairs(companions) do
  local cat = companion.at
  local csid = ARGV[cat.session]
  local cversion = companion.version
  local ccount = tonumber(ARGV[cat.events])
  if ccount > 0 then
    feed[#feed + 1] = ARGV[cat.feed_name]
    feed[#feed + 1] = ccount == 1 and (cversion + 1) or (cversion + 1) .. '-' .. (cversion + ccount)
  end
  local k = cat.events + 1
  for _ = 1, ccount do
    cversion = cversion + 1
    redis.call('XADD', KEYS[11 + 4 * n], cversion .. '-0', 'type', ARGV[k], 'data', ARGV[k + 1], 'v', protocol)
    k = k + 2
  end
  redis.call('HSET', KEYS[12 + 4 * n], 'version', cversion, 'snapshot', ARGV[cat.snapshot], 'etag', companion.etag)
  k = cat.outbound + 1
  for _ = 1, tonumber(ARGV[cat.outbound]) do
    redis.call('HSET', KEYS[14], ARGV[k], ARGV[k + 1])
    k = k + 2
  end
  -- A notice is new mail on the companion: one copy, in the hash it belongs in.
  local cmail, cdue = KEYS[13 + 4 * n], KEYS[14 + 4 * n]
  k = cat.mail + 1
  for _ = 1, tonumber(ARGV[cat.mail]) do
    local message_id, item, where = ARGV[k], ARGV[k + 1], ARGV[k + 2]
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
  for m = 1, tonumber(ARGV[cat.wakes]) do
    redis.call('XADD', KEYS[7], '*', 'session', csid, 'data', ARGV[cat.wakes + m], 'v', protocol)
  end
  local cdue_op, cdue_at = ARGV[cat.due_op], ARGV[cat.due_at]
  if cdue_op == 'set' then
    redis.call('ZADD', KEYS[13], cdue_at, csid)
  elseif cdue_op == 'lt' then
    redis.call('ZADD', KEYS[13], 'LT', cdue_at, csid)
  elseif cdue_op == 'del' then
    redis.call('ZREM', KEYS[13], csid)
  end
end
if #feed > 2 then redis.call('XADD', KEYS[9], 'MAXLEN', '~', ARGV[at.feed_maxlen], '*', unpack(feed)) end
i = at.outbound + 1
for _ = 1, tonumber(ARGV[at.outbound]) do
  redis.call('HSET', KEYS[14], ARGV[i], ARGV[i + 1])
  i = i + 2
end
if ARGV[at.record] ~= '' then redis.call('HSET', KEYS[4], ARGV[at.record_field], ARGV[at.record]) end
-- The producer's answer and the command's acknowledgement, in the same step as the decision they report
-- (one server, fast profile): the answer exists exactly when the append does, one round trip sooner.
local answer = ARGV[at.answer]
if answer ~= '' then
  redis.call('LPUSH', KEYS[#KEYS - 2], answer)
  redis.call('EXPIRE', KEYS[#KEYS - 2], ARGV[at.answer_ttl])
  redis.call('XACK', KEYS[#KEYS - 1], ARGV[at.command_group], ARGV[at.entry_id])
end
return {'ok', tostring(version)}
