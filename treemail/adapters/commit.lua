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
-- The header: where each section begins (4-byte little-endian integers, commitargs.py), unpacked at once into
-- one local per section, in the order of commitargs' fields. Locals, not a table by name: the header is read on
-- every append, and filling a table of names cost about as much as two of the calls the step makes.
local at_etags, at_snapshot, at_record, at_record_field, at_legacy_field, at_registration, at_session,
  at_feed_name, at_feed_maxlen, at_due_op, at_due_at, at_answer, at_answer_ttl, at_command_group, at_entry_id,
  at_drain_read, at_protocol, at_events, at_mail, at_wakes, at_approvals, at_grants, at_outbound,
  at_companions = struct.unpack('<' .. string.rep('I4', 24), ARGV[1])
-- A companion's header, the same way (its sections in the order of commitargs' companion fields).
local COMPANION_HEADER = '<' .. string.rep('I4', 10)

local sid = ARGV[at_session]
if ARGV[at_record] ~= '' then
  -- Under its field, or under the field an earlier version wrote it in (the digest's text).
  local existing = redis.call('HMGET', KEYS[4], ARGV[at_record_field], ARGV[at_legacy_field])
  if existing[1] or existing[2] then return {'dup', existing[1] or existing[2]} end
end
local state = redis.call('HMGET', KEYS[2], 'version', 'etag')
local current = tonumber(state[1] or '0')
local etags = ARGV[at_etags]
local space = string.find(etags, ' ', 1, true)
if (state[2] or '') ~= string.sub(etags, 1, space - 1) then return {'conflict', tostring(current)} end
-- The drain flag the decision read is part of the state it decided on: a drain that began since is a conflict.
local drain_read = ARGV[at_drain_read]
if drain_read ~= '' and tostring(redis.call('EXISTS', KEYS[#KEYS])) ~= drain_read then
  return {'conflict', tostring(current)}
end

-- Companions (exact source capacity): other sessions of the partition the same decision appends to (a sender's
-- record of the message its recipient accepted or settled). Every etag is checked before anything
-- is written, so the step applies whole or not at all.
local companions = {}
for n = 1, tonumber(ARGV[at_companions]) do
  -- Its etags are its first section: the one position the checks need.
  local cstate = redis.call('HMGET', KEYS[12 + 4 * n], 'version', 'etag')
  local cetags = ARGV[struct.unpack('<I4', ARGV[at_companions + n])]
  local cspace = string.find(cetags, ' ', 1, true)
  if (cstate[2] or '') ~= string.sub(cetags, 1, cspace - 1) then return {'conflict', tostring(current)} end
  companions[n] = {version = tonumber(cstate[1] or '0'), etag = string.sub(cetags, cspace + 1)}
end
local registration = ARGV[at_registration]
if registration ~= '' then
  if registration ~= '*' and redis.call('HSETNX', KEYS[5], registration, sid) == 0 then return {'handle_taken', ''} end
  redis.call('SADD', KEYS[6], sid)
  redis.call('SADD', KEYS[8], sid)
end
local protocol = ARGV[at_protocol]
local events = tonumber(ARGV[at_events])
local i = at_events + 1
local version = current
for _ = 1, events do
  version = version + 1
  -- The entry id is the event's position: readers address events by version.
  redis.call('XADD', KEYS[1], version .. '-0', 'type', ARGV[i], 'data', ARGV[i + 1], 'v', protocol)
  i = i + 2
end
redis.call('HSET', KEYS[2], 'version', version, 'snapshot', ARGV[at_snapshot], 'etag', string.sub(etags, space + 1))
i = at_mail + 1
-- An item lives in one of two hashes: the due hash while a claim may take it, the pending-mail hash
-- otherwise. One copy, and a new message costs one write.
for _ = 1, tonumber(ARGV[at_mail]) do
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
for n = 1, tonumber(ARGV[at_wakes]) do
  -- In the same step as the event: a wake is never requested without its trigger.
  redis.call('XADD', KEYS[7], '*', 'session', sid, 'data', ARGV[at_wakes + n], 'v', protocol)
end
i = at_approvals + 1
for _ = 1, tonumber(ARGV[at_approvals]) do
  redis.call('HSET', KEYS[10], ARGV[i], ARGV[i + 1])
  i = i + 2
end
for n = 1, tonumber(ARGV[at_grants]) do
  redis.call('SADD', KEYS[11], ARGV[at_grants + n])
end
-- The partition feed lets projections follow every session of the partition
-- through one stream: one entry per step, naming each session the step appended to
-- and the positions it appended there ("7", or "7-9" for several). It carries no copy
-- of the events, nor their types: readers take those from the session streams (feed.py).
local feed = {'v', protocol}
if events == 1 then
  feed[3], feed[4] = ARGV[at_feed_name], version
elseif events > 1 then
  feed[3], feed[4] = ARGV[at_feed_name], (current + 1) .. '-' .. version
end

-- Mail as an obligation: when the delivery pump must next look at this session (the commit plan computes it).
local due_op, due_at = ARGV[at_due_op], ARGV[at_due_at]
if due_op == 'set' then
  redis.call('ZADD', KEYS[13], due_at, sid)
elseif due_op == 'lt' then
  redis.call('ZADD', KEYS[13], 'LT', due_at, sid)
elseif due_op == 'del' then
  redis.call('ZREM', KEYS[13], sid)
end
for n, companion in ipairs(companions) do
  local cat_etags, cat_snapshot, cat_session, cat_feed_name, cat_due_op, cat_due_at, cat_events, cat_outbound,
    cat_mail, cat_wakes = struct.unpack(COMPANION_HEADER, ARGV[at_companions + n])
  local csid = ARGV[cat_session]
  local cversion = companion.version
  local ccount = tonumber(ARGV[cat_events])
  if ccount > 0 then
    feed[#feed + 1] = ARGV[cat_feed_name]
    feed[#feed + 1] = ccount == 1 and (cversion + 1) or (cversion + 1) .. '-' .. (cversion + ccount)
  end
  local k = cat_events + 1
  for _ = 1, ccount do
    cversion = cversion + 1
    redis.call('XADD', KEYS[11 + 4 * n], cversion .. '-0', 'type', ARGV[k], 'data', ARGV[k + 1], 'v', protocol)
    k = k + 2
  end
  redis.call('HSET', KEYS[12 + 4 * n], 'version', cversion, 'snapshot', ARGV[cat_snapshot], 'etag', companion.etag)
  k = cat_outbound + 1
  for _ = 1, tonumber(ARGV[cat_outbound]) do
    redis.call('HSET', KEYS[14], ARGV[k], ARGV[k + 1])
    k = k + 2
  end
  -- A notice is new mail on the companion: one copy, in the hash it belongs in.
  local cmail, cdue = KEYS[13 + 4 * n], KEYS[14 + 4 * n]
  k = cat_mail + 1
  for _ = 1, tonumber(ARGV[cat_mail]) do
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
  for m = 1, tonumber(ARGV[cat_wakes]) do
    redis.call('XADD', KEYS[7], '*', 'session', csid, 'data', ARGV[cat_wakes + m], 'v', protocol)
  end
  local cdue_op, cdue_at = ARGV[cat_due_op], ARGV[cat_due_at]
  if cdue_op == 'set' then
    redis.call('ZADD', KEYS[13], cdue_at, csid)
  elseif cdue_op == 'lt' then
    redis.call('ZADD', KEYS[13], 'LT', cdue_at, csid)
  elseif cdue_op == 'del' then
    redis.call('ZREM', KEYS[13], csid)
  end
end
if #feed > 2 then redis.call('XADD', KEYS[9], 'MAXLEN', '~', ARGV[at_feed_maxlen], '*', unpack(feed)) end
i = at_outbound + 1
for _ = 1, tonumber(ARGV[at_outbound]) do
  redis.call('HSET', KEYS[14], ARGV[i], ARGV[i + 1])
  i = i + 2
end
if ARGV[at_record] ~= '' then redis.call('HSET', KEYS[4], ARGV[at_record_field], ARGV[at_record]) end
-- The producer's answer and the command's acknowledgement, in the same step as the decision they report
-- (one server, fast profile): the answer exists exactly when the append does, one round trip sooner.
local answer = ARGV[at_answer]
if answer ~= '' then
  redis.call('LPUSH', KEYS[#KEYS - 2], answer)
  redis.call('EXPIRE', KEYS[#KEYS - 2], ARGV[at_answer_ttl])
  redis.call('XACK', KEYS[#KEYS - 1], ARGV[at_command_group], ARGV[at_entry_id])
end
return {'ok', tostring(version)}
