package redis_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/redisservers"
	"github.com/spate-go/spate/stores/redis"
)

// fakeRedis speaks just enough RESP2 to look like an old server: HELLO is
// an unknown command (as on servers that speak only RESP2), INFO answers with info, and
// everything else is recorded and answered +OK.
type fakeRedis struct {
	ln   net.Listener
	info string
	mu   sync.Mutex
	seen []string
	wg   sync.WaitGroup
}

func startFakeRedis(t *testing.T, info string) *fakeRedis {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := &fakeRedis{ln: ln, info: info}
	f.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.wg.Go(func() { f.serve(c) })
		}
	})
	t.Cleanup(func() { ln.Close(); f.wg.Wait() })
	return f
}

func (f *fakeRedis) commands() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.seen...)
}

func (f *fakeRedis) serve(c net.Conn) {
	defer c.Close()
	r := bufio.NewReader(c)
	for {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		args, err := readCommand(r)
		if err != nil {
			return
		}
		cmd := strings.ToUpper(args[0])
		f.mu.Lock()
		f.seen = append(f.seen, cmd)
		f.mu.Unlock()
		var reply string
		switch cmd {
		case "HELLO":
			reply = "-ERR unknown command 'HELLO'\r\n"
		case "INFO":
			reply = "$" + strconv.Itoa(len(f.info)) + "\r\n" + f.info + "\r\n"
		default:
			reply = "+OK\r\n"
		}
		if _, err := io.WriteString(c, reply); err != nil {
			return
		}
	}
}

// readCommand reads one RESP array of bulk strings.
func readCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(line, "*") {
		return nil, fmt.Errorf("not an array: %q", line)
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil || n < 1 {
		return nil, fmt.Errorf("bad array header %q", line)
	}
	args := make([]string, n)
	for i := range args {
		h, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		l, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(h, "$")))
		if err != nil {
			return nil, fmt.Errorf("bad bulk header %q", h)
		}
		b := make([]byte, l+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, err
		}
		args[i] = string(b[:l])
	}
	return args, nil
}

func TestOldServerVersionIsFatal(t *testing.T) {
	t.Parallel()
	f := startFakeRedis(t, "# Server\r\nredis_version:6.2.14\r\nredis_mode:standalone\r\n")
	c := goredis.NewClient(&goredis.Options{Addr: f.ln.Addr().String(), MaxRetries: -1, DialTimeout: 2 * time.Second})
	defer c.Close()
	_, err := redis.New(t.Context(), c, redis.Options{Job: "old", TTL: testTTL})
	require.True(t, spate.IsFatal(err), "New against Redis 6.2.14: %v, want a Fatal error", err)
	for _, want := range []string{"Redis 6.2.14", "needs " + redis.MinServerVersion + " or newer", "upgrade"} {
		assert.ErrorContains(t, err, want)
	}
	cmds := f.commands()
	assert.NotContains(t, cmds, "EVAL", "the driver sent EVAL to a server it refuses")
	assert.NotContains(t, cmds, "EVALSHA", "the driver sent EVALSHA to a server it refuses")
	t.Logf("error: %v", err)
}

func TestServerThatIsNotRedisIsFatal(t *testing.T) {
	t.Parallel()
	f := startFakeRedis(t, "# Server\r\nsome_other_version:1.0\r\n")
	c := goredis.NewClient(&goredis.Options{Addr: f.ln.Addr().String(), MaxRetries: -1, DialTimeout: 2 * time.Second})
	defer c.Close()
	_, err := redis.New(t.Context(), c, redis.Options{Job: "alien", TTL: testTTL})
	require.True(t, spate.IsFatal(err), "New against a server without redis_version: %v, want a Fatal error saying so", err)
	require.ErrorContains(t, err, "no redis_version", "New against a server without redis_version")
	require.NotErrorIs(t, err, spate.ErrRetryable, "classified retryable")
}

// A Redis configured as a cache (a memory limit with an allkeys-* eviction
// policy) could drop the job's durable keys under memory pressure; it is
// refused at startup, naming the setting to change. A volatile-* policy never
// touches the driver's keys (none has a Redis TTL) and is accepted.
func TestEvictingServerIsFatal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy string
		refuse bool
	}{{"allkeys-lru", true}, {"allkeys-random", true}, {"volatile-lru", false}, {"noeviction", false}} {
		t.Run(tc.policy, func(t *testing.T) {
			t.Parallel()
			srv := redisservers.Start(t, redisservers.WithArgs("--maxmemory", "64mb", "--maxmemory-policy", tc.policy))
			s, err := srv.NewHarness(t, testTTL).Open(t.Context())
			if !tc.refuse {
				require.NoError(t, err, "maxmemory-policy %s refused", tc.policy)
				_ = s.Close()
				return
			}
			require.True(t, spate.IsFatal(err), "maxmemory-policy %s: %v, want a Fatal error", tc.policy, err)
			for _, want := range []string{"maxmemory-policy " + tc.policy, "noeviction"} {
				assert.ErrorContains(t, err, want)
			}
			n, derr := srv.Client(t).DBSize(t.Context()).Result()
			assert.NoError(t, derr, "DBSize after the refusal")
			assert.Zero(t, n, "the refused store left %d keys", n)
		})
	}
}
