package redisbus

// The Lua scripts redisbus runs on the server, each one atomic: claiming
// idle entries with their delivery counts, keeping held entries from
// being claimed, counting the holders that ran a redelivered entry,
// trimming no further than the groups allow, and the partitioned mode's
// leases and the reads and acknowledgements they fence. go-redis sends them with EVALSHA and loads them when the server
// does not know them yet.

import "github.com/redis/go-redis/v9"

// claimScript claims entries of stream KEYS[1] idle for at least ARGV[3]
// ms for consumer ARGV[2] of group ARGV[1] (XAUTOCLAIM from ARGV[4],
// COUNT ARGV[5]) and returns {next, entries, counts, deleted}: the
// cursor, the entries, each one's delivery count (after this claim), and
// the IDs of pending entries no longer in the stream, whose run counts
// it deletes from the hash KEYS[2]. With KEYS[3] (a lease) it claims
// only while the lease holds ARGV[6], and returns nil otherwise.
var claimScript = redis.NewScript(`
if KEYS[3] and redis.call('GET', KEYS[3]) ~= ARGV[6] then return false end
local r = redis.call('XAUTOCLAIM', KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], 'COUNT', ARGV[5])
local counts = {}
for i, e in ipairs(r[2]) do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], e[1], e[1], 1)
  counts[i] = p[1] and p[1][4] or 1
end
local deleted = r[3] or {}
if #deleted > 0 then redis.call('HDEL', KEYS[2], unpack(deleted)) end
return {r[1], r[2], counts, deleted}
`)

// touchScript claims again, for consumer ARGV[2] of group ARGV[1] on
// stream KEYS[1], the entries ARGV[4...] that consumer still holds,
// setting their idle time to ARGV[3] ms without counting a delivery
// (XCLAIM JUSTID IDLE): 0 keeps them from being claimed by others while
// the member works on them; the claim idle time hands them back to the
// group at once. It returns how many it touched.
var touchScript = redis.NewScript(`
local args = {KEYS[1], ARGV[1], ARGV[2], 0}
for i = 4, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1, ARGV[2])
  if p[1] then args[#args + 1] = ARGV[i] end
end
local n = #args - 4
if n == 0 then return 0 end
-- unpack only expands in last place: the options go in the table too.
args[#args + 1] = 'IDLE'
args[#args + 1] = ARGV[3]
args[#args + 1] = 'JUSTID'
redis.call('XCLAIM', unpack(args))
return n
`)

// trimScript trims stream KEYS[1] to about ARGV[1] entries (MAXLEN; 0:
// no bound) and drops entries older than ARGV[2] ms (MINID; 0: no
// bound), never past the lowest entry a group of the stream still needs
// (its lowest pending entry, or the last one it read) unless ARGV[3] is
// "1". It looks at no more than ARGV[4] entries, so that a long backlog
// is trimmed over several calls. It returns the entries removed.
var trimScript = redis.NewScript(`
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local function less(a, b)
  local am, as = parse(a)
  local bm, bs = parse(b)
  return am < bm or (am == bm and as < bs)
end
local floor = nil
if ARGV[3] ~= '1' then
  for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
    local name, need
    for i = 1, #g, 2 do
      if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then need = g[i + 1] end
    end
    local p = redis.call('XPENDING', KEYS[1], name)
    if p[1] > 0 and less(p[2], need) then need = p[2] end
    if not floor or less(need, floor) then floor = need end
  end
end
local target = nil
local age = tonumber(ARGV[2])
if age > 0 then
  local t = redis.call('TIME')
  target = string.format('%d-0', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - age)
end
local maxlen = tonumber(ARGV[1])
if maxlen > 0 then
  local excess = redis.call('XLEN', KEYS[1]) - maxlen
  if excess > 0 then
    local upto = '+'
    if floor then upto = '(' .. floor end
    local r = redis.call('XRANGE', KEYS[1], '-', upto, 'COUNT', math.min(excess, tonumber(ARGV[4])))
    if #r > 0 then
      local ms, seq = parse(r[#r][1])
      local after = string.format('%d-%d', ms, seq + 1)
      if not target or less(target, after) then target = after end
    end
  end
end
if not target then return 0 end
if floor and less(floor, target) then target = floor end
return redis.call('XTRIM', KEYS[1], 'MINID', target)
`)

// heartbeatScript records member ARGV[1] in the sorted set KEYS[1] as
// alive for ARGV[2] ms (by the server's clock), forgets members whose
// time ran out, and returns {members, owners}: the live members and the
// value of each lease key KEYS[2...] (false when free). ARGV[2] = 0
// removes the member instead.
var heartbeatScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ttl * 2)
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local owners = {}
for i = 2, #KEYS do owners[i - 1] = redis.call('GET', KEYS[i]) end
return {redis.call('ZRANGE', KEYS[1], 0, -1), owners}
`)

// acquireScript takes the lease KEYS[1] for member ARGV[1] for ARGV[2]
// ms when nobody holds it: SET NX PX of "<member>/<token>", the token the
// next of the counter KEYS[2]. It returns the value, or nil when the
// lease is held.
var acquireScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local v = ARGV[1] .. '/' .. redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], v, 'NX', 'PX', ARGV[2])
return v
`)

// renewScript extends each lease KEYS[i] still holding ARGV[i+1] to
// ARGV[1] ms and returns 1 for those, 0 for the others.
var renewScript = redis.NewScript(`
local ok = {}
for i, k in ipairs(KEYS) do
  if redis.call('GET', k) == ARGV[i + 1] then
    redis.call('PEXPIRE', k, ARGV[1])
    ok[i] = 1
  else
    ok[i] = 0
  end
end
return ok
`)

// releaseScript deletes the lease KEYS[1] if it still holds ARGV[1].
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
`)

// ackScript acknowledges entries ARGV[3...] of stream KEYS[1] for group
// ARGV[1] if the lease KEYS[2] still holds ARGV[2] (the fencing token
// of the claim they were read under), deletes their run counts from the
// hash KEYS[3], and returns how many it acknowledged; -1 when the lease
// is no longer that claim's.
var ackScript = redis.NewScript(`
if redis.call('GET', KEYS[2]) ~= ARGV[2] then return -1 end
local n = redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 3))
redis.call('HDEL', KEYS[3], unpack(ARGV, 3))
return n
`)

// runScript counts the holders that ran entry ARGV[2] of stream KEYS[1],
// pending in group ARGV[1], in the hash KEYS[2]: field ARGV[2], value
// "<holders>:<delivery count>", the count being the entry's delivery
// count when the last holder was recorded. A record of an earlier
// delivery gains this holder; one of this delivery already counts it
// (the call is repeated); one of a later delivery, or not a record, is
// another group's or stream's of the same name (delivery counts only
// rise while an entry is pending), and counting starts again: the first
// holder, unrecorded, and this one. It returns the holders, or 2 without
// a record when the entry is no longer pending (another holder
// acknowledged it).
var runScript = redis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if not p[1] then
  redis.call('HDEL', KEYS[2], ARGV[2])
  return 2
end
local count = tonumber(p[1][4])
local holders = 1
local v = redis.call('HGET', KEYS[2], ARGV[2])
if v then
  local h, c = string.match(v, '^(%d+):(%d+)$')
  h, c = tonumber(h), tonumber(c)
  if h and c == count and h > 1 then return h end
  if h and c < count then holders = math.max(h, 1) end
end
holders = holders + 1
redis.call('HSET', KEYS[2], ARGV[2], holders .. ':' .. count)
return holders
`)

// readScript reads, for consumer ARGV[2] of group ARGV[1], up to ARGV[3]
// new entries of each stream KEYS[2i-1] whose lease KEYS[2i] holds
// ARGV[3+i] (XREADGROUP ... >, without blocking). It returns per stream
// {entries, last} (last: the stream's newest ID, to wait after when no
// entry came), or nil when the lease is no longer the member's.
var readScript = redis.NewScript(`
local out = {}
for i = 1, #KEYS / 2 do
  local stream, lease = KEYS[2 * i - 1], KEYS[2 * i]
  if redis.call('GET', lease) ~= ARGV[3 + i] then
    out[i] = false
  else
    local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3], 'STREAMS', stream, '>')
    local entries, last = {}, '0-0'
    if r then entries = r[1][2] end
    if #entries == 0 then
      local top = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)
      if top[1] then last = top[1][1] end
    end
    out[i] = {entries, last}
  end
end
return out
`)

// layoutScript returns the partition count of a topic from its layout
// key KEYS[1] (0: unpartitioned). Asked for ARGV[1] > 0 partitions, it
// records that count for a new topic, and grows a smaller one when ARGV[2]
// is "1"; it returns -1 when the topic's own key KEYS[2] is a stream (an
// unpartitioned topic).
var layoutScript = redis.NewScript(`
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
local want = tonumber(ARGV[1])
if want == 0 then return n end
if n == 0 then
  if redis.call('TYPE', KEYS[2]).ok == 'stream' then return -1 end
  redis.call('SET', KEYS[1], want)
  return want
end
if ARGV[2] == '1' and want > n then
  redis.call('SET', KEYS[1], want)
  return want
end
return n
`)

// destroyScript removes group ARGV[1] from each of the ARGV[2] streams
// KEYS[1...ARGV[2]] that exists, deletes the fields ARGV[3...] of the
// hash KEYS[ARGV[2]+1] and the keys after it.
var destroyScript = redis.NewScript(`
local n = tonumber(ARGV[2])
for i = 1, n do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('XGROUP', 'DESTROY', KEYS[i], ARGV[1]) end
end
if #ARGV > 2 then redis.call('HDEL', KEYS[n + 1], unpack(ARGV, 3)) end
if #KEYS > n + 1 then redis.call('DEL', unpack(KEYS, n + 2)) end
return 0
`)

// delConsumerScript deletes consumer ARGV[2] of group ARGV[1] on stream
// KEYS[1] when nothing is pending for it (deleting a consumer drops its
// pending entries, which nobody could claim then).
var delConsumerScript = redis.NewScript(`
local p = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if p[1] then return 0 end
return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
`)

// reapScript deletes the consumers of group ARGV[1] on stream KEYS[1]
// idle for more than ARGV[2] ms with nothing pending, other than
// ARGV[3]: members that crashed, whose entries were claimed by others.
// A member deleted while alive is created again by its next read.
var reapScript = redis.NewScript(`
local n = 0
for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local name, pending, idle
  for i = 1, #c, 2 do
    if c[i] == 'name' then name = c[i + 1] elseif c[i] == 'pending' then pending = c[i + 1] elseif c[i] == 'idle' then idle = c[i + 1] end
  end
  if name ~= ARGV[3] and pending == 0 and idle > tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], name)
    n = n + 1
  end
end
return n
`)

// countScript counts the members in the sorted set KEYS[1] whose
// heartbeat has not run out by the server's clock.
var countScript = redis.NewScript(`
local t = redis.call('TIME')
return redis.call('ZCOUNT', KEYS[1], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), '+inf')
`)

// joinScript creates group ARGV[1] on stream KEYS[1] (and the stream)
// where it does not exist: at the position recorded for it in the hash
// KEYS[2] (field ARGV[2]), else at ARGV[3]. A group created at the end
// ($) is told how many entries the stream has had (ENTRIESREAD), or
// Redis could not count its lag (XINFO GROUPS lag nil) once entries
// follow, until it has read them all. A group it creates has nothing
// pending: it deletes the run counts KEYS[3] left by a group of that
// name before (destroyed, or on a stream deleted since, whose entry IDs
// may come again). It returns 1 when it created the group, 0 when the
// group existed.
var joinScript = redis.NewScript(`
local at = redis.call('HGET', KEYS[2], ARGV[2]) or ARGV[3]
local args = {'XGROUP', 'CREATE', KEYS[1], ARGV[1], at, 'MKSTREAM'}
if at == '$' then
  local ok, info = pcall(redis.call, 'XINFO', 'STREAM', KEYS[1])
  if ok then
    for i = 1, #info, 2 do
      if info[i] == 'entries-added' then
        table.insert(args, 'ENTRIESREAD')
        table.insert(args, info[i + 1])
      end
    end
  end
end
local r = redis.pcall(unpack(args))
if type(r) == 'table' and r.err then
  if string.sub(r.err, 1, 9) == 'BUSYGROUP' then return 0 end
  return r
end
redis.call('DEL', KEYS[3])
return 1
`)

// recordScript records in the hash KEYS[2] (field ARGV[2]) where group
// ARGV[1] resumes on stream KEYS[1]: the ID before its lowest pending
// entry, or the last entry it read when none is pending. The record only
// rises. It returns the record, or nil when the group does not exist.
var recordScript = redis.NewScript(`
local function parse(id)
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  return tonumber(ms), tonumber(seq)
end
local last = nil
local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[1])
if not ok then return false end
for _, g in ipairs(groups) do
  local name, id
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then id = g[i + 1] end
  end
  if name == ARGV[1] then last = id end
end
if not last then return false end
local at = last
local p = redis.call('XPENDING', KEYS[1], ARGV[1])
if p[1] > 0 then
  local ms, seq = parse(p[2])
  if seq > 0 then at = string.format('%d-%d', ms, seq - 1) elseif ms > 0 then at = string.format('%d-18446744073709551615', ms - 1) else at = '0-0' end
end
local old = redis.call('HGET', KEYS[2], ARGV[2])
if old then
  local om, os = parse(old)
  local am, as = parse(at)
  if am < om or (am == om and as <= os) then return old end
end
redis.call('HSET', KEYS[2], ARGV[2], at)
return at
`)
