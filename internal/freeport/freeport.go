// Package freeport finds free loopback TCP ports for test servers.
//
// A port found free can be taken by another process before the caller
// binds it; the helpers narrow that window but cannot close it. They hold
// all ports of a request open together until the function returns, and on
// Linux they pick ports below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), which neither outgoing connections nor
// other tests' listeners on port 0 are given. Test servers that fail to
// bind should still be retried by their harness.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// Ports reserves n distinct loopback ports by listening on all of them at
// once, then releases them and returns their numbers.
func Ports(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := listen()
		if err != nil {
			return nil, fmt.Errorf("freeport: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// WithOffset finds a loopback port p such that p+offset is free too, for
// servers that derive a second port from the first (the embedded etcd's
// peer port is client port + 10). It fails t when none is found.
func WithOffset(t testing.TB, offset int) int {
	t.Helper()
	for range 50 {
		l, err := listen()
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		l2, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+offset))
		_ = l.Close()
		if err == nil {
			_ = l2.Close()
			return p
		}
	}
	t.Fatalf("freeport: no free loopback port p with p+%d free", offset)
	return 0
}

// belowEphemeral is the span of ports listen draws from, below the start of
// the kernel's ephemeral range; zero when that range is unknown.
func belowEphemeral() (lo, hi int) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0
	}
	start, err := strconv.Atoi(f[0])
	if err != nil || start <= 12000 {
		return 0, 0
	}
	return 10000, start
}

// listen binds a free loopback port: a random one below the ephemeral
// range when that range is known, else one the kernel picks.
func listen() (net.Listener, error) {
	if lo, hi := belowEphemeral(); hi > lo {
		for range 100 {
			p := lo + rand.IntN(hi-lo)
			if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
				return l, nil
			}
		}
	}
	return net.Listen("tcp", "127.0.0.1:0")
}
