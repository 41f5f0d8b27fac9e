-- Read-only: every member of a tree but one, with its registration and its status, in one call.
-- The self-repairing candidate list needs the whole tree; one script call on the tree's slot
-- replaces a round trip per member (the domain then filters, sorts and bounds the list).
--
-- The members' stream and state keys are built here from the prefix and suffixes the caller
-- passes (adapters/keys.py), not declared in KEYS: the members are only known once the set is
-- read. They share the tree's hash tag, so this stays on one slot, on a server or a cluster.
--
-- KEYS: 1 the tree's members set
-- ARGV: 1 session key prefix, 2 events-stream suffix, 3 state-hash suffix, 4 the session to leave out
-- Returns: session id, registration event data (JSON, '' if none), status ('' if unknown), ... flat
local out = {}
for _, sid in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if sid ~= ARGV[4] then
    local first = redis.call('XRANGE', ARGV[1] .. sid .. ARGV[2], '-', '+', 'COUNT', 1)
    local data = ''
    if first[1] then
      local fields = first[1][2]
      local registration = false
      for i = 1, #fields, 2 do
        if fields[i] == 'type' and fields[i + 1] == 'SessionRegistered' then registration = true end
        if fields[i] == 'data' then data = fields[i + 1] end
      end
      if not registration then data = '' end
    end
    local status = ''
    local snapshot = redis.call('HGET', ARGV[1] .. sid .. ARGV[3], 'snapshot')
    if snapshot then
      local ok, decoded = pcall(cjson.decode, snapshot)
      if ok and type(decoded) == 'table' and type(decoded['status']) == 'string' then status = decoded['status'] end
    end
    out[#out + 1] = sid
    out[#out + 1] = data
    out[#out + 1] = status
  end
end
return out
