// Package freeport finds free loopback TCP ports for test servers.
//
// A port found free can be taken by another process before the caller
// binds it; the helpers narrow that window (all ports of a request are held
// open together until the function returns) but cannot close it, so test
// servers that fail to bind should be retried by their harness.
package freeport

import (
	"fmt"
	"net"
	"strconv"
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
		l, err := net.Listen("tcp", "127.0.0.1:0")
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
		l, err := net.Listen("tcp", "127.0.0.1:0")
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
