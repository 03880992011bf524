package faultproxy

import (
	"bufio"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo serves lines back, counting the requests it saw.
func echo(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
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
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestForwardsAndAddsLatency(t *testing.T) {
	target, _ := echo(t)
	p := New(t, target)
	c := dial(t, p)
	if got, err := roundTrip(c, "hello", time.Second); err != nil || got != "hello" {
		t.Fatalf("got %q %v", got, err)
	}
	p.SetLatency(100 * time.Millisecond)
	start := time.Now()
	if _, err := roundTrip(c, "slow", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Fatalf("latency not applied both ways: %v", took)
	}
}

func TestBlockCutsAndRefusesUntilHealed(t *testing.T) {
	target, _ := echo(t)
	p := New(t, target)
	c := dial(t, p)
	if _, err := roundTrip(c, "a", time.Second); err != nil {
		t.Fatal(err)
	}
	p.Block()
	if _, err := roundTrip(c, "b", time.Second); err == nil {
		t.Fatal("a blocked connection must be cut")
	}
	if c2, err := net.Dial("tcp", p.Addr()); err == nil {
		if _, err := roundTrip(c2, "c", 500*time.Millisecond); err == nil {
			t.Fatal("new connections must be refused while blocked")
		}
		c2.Close()
	}
	p.Heal()
	if got, err := roundTrip(dial(t, p), "d", time.Second); err != nil || got != "d" {
		t.Fatalf("after heal: %q %v", got, err)
	}
}

func TestBlackholeHoldsBytesUntilHealed(t *testing.T) {
	target, _ := echo(t)
	p := New(t, target)
	c := dial(t, p)
	p.Blackhole()
	if _, err := roundTrip(c, "lost", 300*time.Millisecond); err == nil {
		t.Fatal("a blackholed round trip must time out")
	}
	p.Heal()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	s, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || strings.TrimSpace(s) != "lost" {
		t.Fatalf("held bytes must flow after heal: %q %v", s, err)
	}
}

func TestDropReplyLandsTheRequestButLosesTheAnswer(t *testing.T) {
	target, seen := echo(t)
	p := New(t, target)
	c := dial(t, p)
	p.DropReplyTo([]byte("commit"))
	if _, err := roundTrip(c, "commit 7", time.Second); err == nil {
		t.Fatal("the reply must be lost")
	}
	time.Sleep(50 * time.Millisecond)
	if seen.Load() != 1 {
		t.Fatalf("the request must reach the server once, saw %d", seen.Load())
	}
	if p.Armed() || p.Faults() != 1 {
		t.Fatalf("armed=%t faults=%d", p.Armed(), p.Faults())
	}
	if got, err := roundTrip(dial(t, p), "next", time.Second); err != nil || got != "next" {
		t.Fatalf("later requests pass: %q %v", got, err)
	}
}
