package etcdservers

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections from a loopback port to a target address.
// [Proxy.Block] cuts every open connection and refuses new ones until
// [Proxy.Unblock]: a network partition between a client and one member.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	blocked bool
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

// NewProxy starts a proxy to target (host:port) and closes it when t ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("etcdservers: proxy listen: %v", err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Block closes every forwarded connection and refuses new ones.
func (p *Proxy) Block() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Unblock lets connections through again.
func (p *Proxy) Unblock() {
	p.mu.Lock()
	p.blocked = false
	p.mu.Unlock()
}

// Close stops the proxy and waits for its goroutines.
func (p *Proxy) Close() {
	_ = p.ln.Close()
	p.Block()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		blocked := p.blocked
		p.mu.Unlock()
		if blocked {
			_ = in.Close()
			continue
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = in.Close()
			continue
		}
		if !p.track(in, out) {
			continue
		}
		p.wg.Go(func() { p.pipe(in, out) })
		p.wg.Go(func() { p.pipe(out, in) })
	}
}

// track registers a connection pair unless the proxy blocked meanwhile.
func (p *Proxy) track(in, out net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blocked {
		_ = in.Close()
		_ = out.Close()
		return false
	}
	p.conns[in] = struct{}{}
	p.conns[out] = struct{}{}
	return true
}

func (p *Proxy) pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	_ = dst.Close()
	_ = src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}
