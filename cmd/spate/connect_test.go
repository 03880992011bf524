package main

import (
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/internal/freeport"
	"github.com/spate-go/spate/internal/redisservers"
)

// silentListener accepts connections and never answers: a store URL
// pointing at the wrong service, or rediss:// at a plain server, looks like
// this to a client.
func silentListener(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return l.Addr().String()
}

// Every store connect ends within --connect-timeout, and the error says
// which store it was connecting to and that the timeout elapsed: against a
// port nobody listens on and against one that accepts and never answers,
// for etcd, Redis (plain and TLS) and NATS (plain and TLS), from backfill
// and from inspect. The bound (3x the timeout, process start included)
// only catches hangs; it does not time the connect.
func TestConnectTimeoutIsHonoured(t *testing.T) {
	t.Parallel()
	const timeout = 2 * time.Second
	ports, err := freeport.Ports(1)
	require.NoError(t, err)
	closed := "127.0.0.1:" + strconv.Itoa(ports[0]) // nobody listens here
	silent := silentListener(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	writeCorpus(t, src, 1, 10)
	for _, tc := range []struct {
		name, url, shows string
	}{
		{"etcd closed port", "etcd://" + closed, "etcd at http://" + closed},
		{"etcd silent port", "etcd://" + silent, "etcd at http://" + silent},
		{"redis closed port", "redis://" + closed, "redis://" + closed},
		{"rediss against a plain port", "rediss://" + silent, "rediss://" + silent},
		{"nats closed port", "nats://" + closed, "nats at nats://" + closed},
		{"nats silent port", "nats://" + silent, "nats at nats://" + silent},
		{"nats tls silent port", "tls://" + silent, "nats at tls://" + silent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dst := filepath.Join(t.TempDir(), "dst")
			began := time.Now()
			code, out, errOut := runSpate(t, dir, "", 10*timeout, "backfill", "--src", src, "--dst", dst,
				"--store", tc.url, "--connect-timeout", timeout.String(), "--quiet")
			elapsed := time.Since(began)
			assert.Equal(t, exitFailed, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
			assert.Contains(t, errOut, "spate: could not connect to "+tc.shows)
			assert.Contains(t, errOut, "--connect-timeout 2s elapsed")
			assert.Less(t, elapsed, 3*timeout, "backfill did not give up within 3x --connect-timeout")
			assert.NoDirExists(t, dst)
		})
	}
	t.Run("rediss against a plain redis", func(t *testing.T) {
		t.Parallel()
		srv := redisservers.Start(t) // a plain server: it answers, but not TLS
		dst := filepath.Join(t.TempDir(), "dst")
		began := time.Now()
		code, out, errOut := runSpate(t, dir, "", 10*timeout, "backfill", "--src", src, "--dst", dst,
			"--store", "rediss://"+srv.Addr(), "--connect-timeout", timeout.String(), "--quiet")
		elapsed := time.Since(began)
		assert.Equal(t, exitFailed, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
		assert.Contains(t, errOut, "could not connect to rediss://"+srv.Addr()+": --connect-timeout 2s elapsed")
		assert.Contains(t, errOut, "does that port speak TLS?")
		assert.Less(t, elapsed, 3*timeout, "backfill did not give up within 3x --connect-timeout")
	})
	t.Run("inspect", func(t *testing.T) {
		t.Parallel()
		began := time.Now()
		code, out, errOut := runSpate(t, dir, "", 10*timeout, "inspect", "--store", "etcd://"+silent, "--connect-timeout", timeout.String())
		elapsed := time.Since(began)
		assert.Equal(t, exitFailed, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
		assert.Contains(t, errOut, "could not connect to etcd at http://"+silent+": --connect-timeout 2s elapsed")
		assert.Less(t, elapsed, 3*timeout, "inspect did not give up within 3x --connect-timeout")
	})
}
