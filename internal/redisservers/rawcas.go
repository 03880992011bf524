package redisservers

import (
	"context"
	"fmt"

	goredis "github.com/redis/go-redis/v9"
)

// rawCAS is about the least work a compare-and-swap can do in one Lua
// script: compare a revision, bump it, store the value. It mints no
// keyspace-wide revision and logs nothing for watchers, so it is the floor
// against which a driver's or a coordinator's commit is measured.
var rawCAS = goredis.NewScript(`
if redis.call('HGET', KEYS[1], 'r') ~= ARGV[1] then return 0 end
local rev = redis.call('HINCRBY', KEYS[1], 'r', 1)
redis.call('HSET', KEYS[1], 'v', ARGV[2])
return rev
`)

// RawCAS runs [rawCAS] against one key with EVALSHA, for benchmarks that
// pair a store's or a coordinator's commit with the bare script on the same
// server.
type RawCAS struct {
	c   goredis.UniversalClient
	key string
	rev int64
}

// NewRawCAS resets key to revision 1 and loads the script.
func NewRawCAS(ctx context.Context, c goredis.UniversalClient, key string) (*RawCAS, error) {
	if err := c.HSet(ctx, key, "r", 1, "v", "").Err(); err != nil {
		return nil, err
	}
	if err := rawCAS.Load(ctx, c).Err(); err != nil {
		return nil, err
	}
	return &RawCAS{c: c, key: key, rev: 1}, nil
}

// Swap writes value at the revision the last Swap produced; losing is an
// error, since a benchmark's single writer never should.
func (r *RawCAS) Swap(ctx context.Context, value []byte) error {
	rev, err := rawCAS.EvalSha(ctx, r.c, []string{r.key}, r.rev, value).Int64()
	if err != nil {
		return err
	}
	if rev == 0 {
		return fmt.Errorf("redisservers: raw CAS at revision %d lost", r.rev)
	}
	r.rev = rev
	return nil
}
