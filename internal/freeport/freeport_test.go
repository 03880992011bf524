package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestPortsAreDistinctAndBindable(t *testing.T) {
	ps, err := Ports(4)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, p := range ps {
		if seen[p] {
			t.Fatalf("port %d returned twice in %v", p, ps)
		}
		seen[p] = true
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d is not bindable after Ports returned: %v", p, err)
		}
		l.Close()
	}
}

func TestWithOffsetLeavesBothFree(t *testing.T) {
	p := WithOffset(t, 10)
	for _, q := range []int{p, p + 10} {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(q))
		if err != nil {
			t.Fatalf("port %d: %v", q, err)
		}
		l.Close()
	}
}
