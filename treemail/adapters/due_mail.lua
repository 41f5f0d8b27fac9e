-- The pending mail a claim may take, in one round trip: the session's due hash names the
-- messages, its mail hash holds each item once. Returns (message id, item json) pairs.
-- KEYS: 1 the due hash, 2 the mail hash (one session: one hash slot).
local ids = redis.call('HKEYS', KEYS[1])
local out = {}
-- HMGET in slices: unpack() of a whole large backlog would overflow Lua's stack.
for first = 1, #ids, 500 do
  local slice = {}
  for j = first, math.min(#ids, first + 499) do slice[#slice + 1] = ids[j] end
  local items = redis.call('HMGET', KEYS[2], unpack(slice))
  for j = 1, #slice do
    if items[j] then
      out[#out + 1] = slice[j]
      out[#out + 1] = items[j]
    end
  end
end
return out
