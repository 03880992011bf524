package redis

import (
	"context"

	goredis "github.com/redis/go-redis/v9"
)

// The Lua side of the driver. Every operation is one script, so each check,
// write, revision mint and change-log append happens atomically on the
// primary. All scripts of one keyspace receive the same six keys (see
// keyspaceKeys), all carrying the job's hash tag, so on Redis Cluster they
// hash to one slot.
//
// Layout of one keyspace (K = "spate:{job}:d:" or "spate:{job}:e:"):
//
//	K..idx  sorted set, every member at score 0: the live keys, for prefix
//	        ranges with ZRANGEBYLEX
//	K..val  hash key -> value
//	K..rev  hash key -> revision (decimal)
//	K..seq  string: the keyspace's revision counter (INCR)
//	K..log  stream: the change log; entry ID "<revision>-0", fields
//	        k=key, o=p (put, with v=value) or o=d (delete)
//	K..dl   sorted set key -> deadline in server milliseconds (ephemeral)
//
// Every revision minted appends exactly one log entry whose ID is that
// revision, so a reader that sees an ID other than its last one plus one
// knows the log was trimmed past it. The same change is published with
// SPUBLISH on the shard channel named like the log key (channels and keys
// are separate namespaces; the hash tag puts both in the job's slot), so
// watchers hear of it without reading the log, and again on the key's own
// shard channel, K..log:<key> (same hash tag, same slot), for the watches
// of that key alone (WatchKeys).
//
// Revisions travel as decimal strings formatted with %d, exact up to 2^53.

// prelude is shared by the keyspace scripts. ARGV[1] is the TTL in
// milliseconds (0 for the durable keyspace), ARGV[2] the change-log length.
const prelude = `
local IDX, VAL, REV, SEQ, LOG, DL = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local TTL = tonumber(ARGV[1])
local LOGLEN = ARGV[2]

local function now_ms()
  if TTL == 0 then return 0 end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- mint takes the next revision, logs the change under it and publishes it
-- to the keyspace's watchers and, on the key's own channel (LOG..':'..key,
-- see keyChannel in watch.go), to its key watchers (see notice in watch.go
-- for the format). The publishes are pcalls: an ACL user without
-- +spublish or the channels still writes, and watchers find the change in
-- the log.
local function mint(key, value)
  local rev = string.format('%d', redis.call('INCR', SEQ))
  local msg
  if value then
    redis.call('XADD', LOG, 'MAXLEN', '~', LOGLEN, rev .. '-0', 'k', key, 'o', 'p', 'v', value)
    msg = rev .. ' p ' .. #key .. ' ' .. key .. value
  else
    redis.call('XADD', LOG, 'MAXLEN', '~', LOGLEN, rev .. '-0', 'k', key, 'o', 'd')
    msg = rev .. ' d ' .. #key .. ' ' .. key
  end
  redis.pcall('SPUBLISH', LOG, msg)
  redis.pcall('SPUBLISH', LOG .. ':' .. key, msg)
  return rev
end

-- remove deletes a live key at a fresh revision.
local function remove(key)
  redis.call('ZREM', IDX, key)
  redis.call('HDEL', VAL, key)
  redis.call('HDEL', REV, key)
  if TTL > 0 then redis.call('ZREM', DL, key) end
  return mint(key, false)
end

-- current returns a live key's revision, or false when it is absent. A key
-- past its deadline is absent: it is expired here, delete logged.
local function current(key, now)
  local rev = redis.call('HGET', REV, key)
  if not rev then return false end
  if TTL > 0 then
    local d = redis.call('ZSCORE', DL, key)
    if d and tonumber(d) <= now then
      remove(key)
      return false
    end
  end
  return rev
end

-- write stores a value at a fresh revision; on the ephemeral keyspace it
-- (re-)arms the deadline one TTL from now.
local function write(key, value, now)
  local rev = mint(key, value)
  redis.call('ZADD', IDX, 0, key)
  redis.call('HSET', VAL, key, value)
  redis.call('HSET', REV, key, rev)
  if TTL > 0 then redis.call('ZADD', DL, string.format('%d', now + TTL), key) end
  return rev
end
`

// ARGV[3] key, ARGV[4] value. Returns {1, rev} or {0}.
const createBody = `
local now = now_ms()
if current(ARGV[3], now) then return {0} end
return {1, write(ARGV[3], ARGV[4], now)}
`

// ARGV[3] key, ARGV[4] value, ARGV[5] expected revision.
const updateBody = `
local now = now_ms()
if current(ARGV[3], now) ~= ARGV[5] then return {0} end
return {1, write(ARGV[3], ARGV[4], now)}
`

// ARGV[3] key, ARGV[4] expected revision, "0" for an unconditional delete.
const deleteBody = `
local cur = current(ARGV[3], now_ms())
if not cur then
  if ARGV[4] == '0' then return {1, '0'} end
  return {0}
end
if ARGV[4] ~= '0' and cur ~= ARGV[4] then return {0} end
return {1, remove(ARGV[3])}
`

// updateAndDeleteBody is the release: the update script on the durable
// keyspace and, if it wins, the guarded delete script on the ephemeral one,
// in one script. KEYS[1..6] are the durable keyspace's keys, KEYS[7..12]
// the ephemeral one's (all in the job's slot). ARGV[1], ARGV[2] as in the
// prelude (the durable TTL, "0", and the log length); ARGV[3] the durable
// key, ARGV[4] the value, ARGV[5] the expected revision; ARGV[6] the
// ephemeral TTL in milliseconds, ARGV[7] the ephemeral key, ARGV[8] its
// expected revision (never "0"). Rebinding the prelude's locals switches
// current, write, remove and mint to the ephemeral keyspace, so each
// change is minted, logged and published on its own keyspace's counter,
// log and channel exactly as the single-keyspace scripts do. Returns {0},
// {1, rev} (the delete lost its guard) or {1, rev, delete rev}.
const updateAndDeleteBody = `
local now = now_ms()
if current(ARGV[3], now) ~= ARGV[5] then return {0} end
local rev = write(ARGV[3], ARGV[4], now)
IDX, VAL, REV, SEQ, LOG, DL = KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12]
TTL = tonumber(ARGV[6])
local cur = current(ARGV[7], now_ms())
if cur ~= ARGV[8] then return {1, rev} end
return {1, rev, remove(ARGV[7])}
`

// ARGV[3] key. Returns {rev, value}, or {} when absent.
const getBody = `
local cur = current(ARGV[3], now_ms())
if not cur then return {} end
return {cur, redis.call('HGET', VAL, ARGV[3])}
`

// ARGV[3], ARGV[4]: the ZRANGEBYLEX bounds of the prefix. Returns the
// keyspace's last revision followed by key, value, revision triples, sorted
// by key: a snapshot and the change-log position it is current at.
const snapshotBody = `
local now = now_ms()
local out = {redis.call('GET', SEQ) or '0'}
for _, k in ipairs(redis.call('ZRANGEBYLEX', IDX, ARGV[3], ARGV[4])) do
  local rev = current(k, now)
  if rev then
    out[#out + 1] = k
    out[#out + 1] = redis.call('HGET', VAL, k)
    out[#out + 1] = rev
  end
end
return out
`

// ARGV[3..] the keys, sorted and distinct. Returns the keyspace's last
// revision followed by key, value, revision triples of the live ones: a
// key watch's snapshot.
const keysSnapshotBody = `
local now = now_ms()
local out = {redis.call('GET', SEQ) or '0'}
for i = 3, #ARGV do
  local k = ARGV[i]
  local rev = current(k, now)
  if rev then
    out[#out + 1] = k
    out[#out + 1] = redis.call('HGET', VAL, k)
    out[#out + 1] = rev
  end
end
return out
`

// ARGV[3] batch size. Expires up to a batch of keys past their deadline and
// returns how many it expired.
const sweepBody = `
local due = redis.call('ZRANGEBYSCORE', DL, '-inf', now_ms(), 'LIMIT', 0, tonumber(ARGV[3]))
for _, k in ipairs(due) do
  if redis.call('HGET', REV, k) then remove(k) else redis.call('ZREM', DL, k) end
end
return #due
`

// initScript is the startup check. KEYS[1] is the job's meta hash, the rest
// every structural key of the job. ARGV[1] is the layout version, ARGV[2] the
// TTL in milliseconds. It records both on first use, then probes every
// command the other scripts call, with arguments under which each either
// does nothing or fails with WRONGTYPE after the ACL check has passed, so an
// ACL that denies one of them is reported now, by name, rather than on the
// first write. SPUBLISH, which the scripts may be denied, is probed last.
// Returns {"ok", layout, ttl, "push" or SPUBLISH's error} or
// {"denied", what...}.
const initScript = `
local META = KEYS[1]
local denied, seen = {}, {}
local function deny(what)
  if not seen[what] then
    seen[what] = true
    denied[#denied + 1] = what
  end
end
local function try(...)
  local args = {...}
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    if string.find(r.err, "can't run this command", 1, true) then
      deny('+' .. string.lower(args[1]))
    elseif string.find(r.err, "can't access", 1, true) then
      deny('access to key ' .. args[2])
    end
  end
  return r
end
local layout = try('HGET', META, 'layout')
if #denied > 0 then return {'denied', unpack(denied)} end
if not layout then
  try('HSET', META, 'layout', ARGV[1], 'ttl_ms', ARGV[2])
  if #denied > 0 then return {'denied', unpack(denied)} end
end
try('TIME')
try('GET', META)
try('INCR', META)
try('XADD', META, '1-0', 'k', 'v')
try('ZADD', META, 0, 'x')
try('ZRANGEBYLEX', META, '-', '+')
try('ZRANGEBYSCORE', META, 0, 1)
try('HDEL', META, '\0probe')
for i = 2, #KEYS do
  try('ZSCORE', KEYS[i], '\0probe')
  try('ZREM', KEYS[i], '\0probe')
end
if #denied > 0 then return {'denied', unpack(denied)} end
-- Publishing is optional (see mint): report whether it is allowed.
local push = redis.pcall('SPUBLISH', META, '')
if type(push) == 'table' and push.err then push = push.err else push = 'push' end
return {'ok', redis.call('HGET', META, 'layout'), redis.call('HGET', META, 'ttl_ms'), push}
`

// script is a Lua script with its source, for the EVAL fallback.
type script struct {
	*goredis.Script
	src string
}

func newScript(src string) *script {
	return &script{Script: goredis.NewScript(src), src: src}
}

var (
	scriptCreate   = newScript(prelude + createBody)
	scriptUpdate   = newScript(prelude + updateBody)
	scriptDelete   = newScript(prelude + deleteBody)
	scriptRelease  = newScript(prelude + updateAndDeleteBody)
	scriptGet      = newScript(prelude + getBody)
	scriptSnapshot = newScript(prelude + snapshotBody)
	scriptKeys     = newScript(prelude + keysSnapshotBody)
	scriptSweep    = newScript(prelude + sweepBody)
	scriptInit     = newScript(initScript)
)

// onceCmd runs a command exactly once: go-redis must not retry it after a
// network error. A script whose reply was lost may have run; running it
// again could turn a won compare-and-swap into a reported Lost (the second
// run sees the first one's write). The store contract wants one attempt per
// call and a Retryable error that says "may have landed" instead.
type onceCmd struct{ *goredis.Cmd }

// NoRetry implements goredis.Cmder.
func (onceCmd) NoRetry() bool { return true }

// run executes sc once with EVALSHA, falling back to EVAL when the server
// does not have it cached (NOSCRIPT means it did not run, so the fallback
// is not a retry).
func run(ctx context.Context, c goredis.UniversalClient, sc *script, keys []string, args ...any) (any, error) {
	res, err := eval(ctx, c, "evalsha", sc.Hash(), keys, args)
	if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		res, err = eval(ctx, c, "eval", sc.src, keys, args)
	}
	return res, err
}

func eval(ctx context.Context, c goredis.UniversalClient, verb, body string, keys []string, args []any) (any, error) {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, verb, body, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, args...)
	cmd := goredis.NewCmd(ctx, a...)
	_ = c.Process(ctx, onceCmd{cmd})
	return cmd.Result()
}
