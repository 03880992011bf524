package faultproxy

import (
	"bufio"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo serves lines back, counting the requests it saw.
func echo(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	seen := new(atomic.Int64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					seen.Add(1)
					c.Write([]byte(line))
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String(), seen
}

func roundTrip(c net.Conn, msg string, d time.Duration) (string, error) {
	c.SetDeadline(time.Now().Add(d))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	s, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(s), err
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func TestForwardsAndAddsLatency(t *testing.T) {
	target, _ := echo(t)
	p := New(t, target)
	c := dial(t, p)
	got, err := roundTrip(c, "hello", time.Second)
	require.NoError(t, err)
	require.Equal(t, "hello", got)
	p.SetLatency(100 * time.Millisecond)
	start := time.Now()
	_, err = roundTrip(c, "slow", 5*time.Second)
	require.NoError(t, err)
	require.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond, "latency not applied both ways")
}

func TestBlockCutsAndRefusesUntilHealed(t *testing.T) {
	target, _ := echo(t)
	p := New(t, target)
	c := dial(t, p)
	_, err := roundTrip(c, "a", time.Second)
	require.NoError(t, err)
	p.Block()
	_, err = roundTrip(c, "b", time.Second)
	require.Error(t, err, "a blocked connection must be cut")
	if c2, err := net.Dial("tcp", p.Addr()); err == nil {
		_, err = roundTrip(c2, "c", 500*time.Millisecond)
		require.Error(t, err, "new connections must be refused while blocked")
		c2.Close()
	}
	p.Heal()
	got, err := roundTrip(dial(t, p), "d", time.Second)
	require.NoError(t, err, "after heal")
	require.Equal(t, "d", got, "after heal")
}

func TestBlackholeHoldsBytesUntilHealed(t *testing.T) {
	target, _ := echo(t)
	p := New(t, target)
	c := dial(t, p)
	p.Blackhole()
	_, err := roundTrip(c, "lost", 300*time.Millisecond)
	require.Error(t, err, "a blackholed round trip must time out")
	p.Heal()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	s, err := bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err, "held bytes must flow after heal: read %q", s)
	require.Equal(t, "lost", strings.TrimSpace(s), "held bytes must flow after heal")
}

func TestDropReplyLandsTheRequestButLosesTheAnswer(t *testing.T) {
	target, seen := echo(t)
	p := New(t, target)
	c := dial(t, p)
	p.DropReplyTo([]byte("commit"))
	_, err := roundTrip(c, "commit 7", time.Second)
	require.Error(t, err, "the reply must be lost")
	time.Sleep(50 * time.Millisecond)
	require.Equal(t, int64(1), seen.Load(), "the request must reach the server once")
	require.False(t, p.Armed(), "armed=%t faults=%d", p.Armed(), p.Faults())
	require.Equal(t, 1, p.Faults(), "armed=%t faults=%d", p.Armed(), p.Faults())
	got, err := roundTrip(dial(t, p), "next", time.Second)
	require.NoError(t, err, "later requests pass")
	require.Equal(t, "next", got, "later requests pass")
}
