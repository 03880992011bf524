package redisservers

import (
	"bytes"
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy in front of a server that can lose a reply: the
// request reaches the server and runs, but the client's connection is
// closed instead of receiving the answer, as when a network path fails
// between the two halves of a round trip.
type Proxy struct {
	l      net.Listener
	target string

	mu     sync.Mutex
	drop   []byte // when set, drop the reply to the next request containing it
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewProxy listens on a free loopback port and forwards to target. It is
// closed when t ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redisservers: proxy listen: %v", err)
	}
	p := &Proxy{l: l, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the address clients dial.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// DropReplyTo arms the proxy: the next request whose bytes contain pattern
// is forwarded, and its reply is thrown away and the client's connection
// closed. It fires once.
func (p *Proxy) DropReplyTo(pattern string) {
	p.mu.Lock()
	p.drop = []byte(pattern)
	p.mu.Unlock()
}

// Armed reports whether the armed drop has not fired yet.
func (p *Proxy) Armed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.drop != nil
}

// Close stops accepting, closes every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() {
	_ = p.l.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// track registers a connection pair; false if the proxy is closed.
func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	_ = c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.l.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		if !p.track(client, server) {
			_ = client.Close()
			_ = server.Close()
			return
		}
		doomed := make(chan struct{}, 1)
		p.wg.Add(2)
		go func() { // client -> server
			defer p.wg.Done()
			defer p.untrack(server)
			buf := make([]byte, 64<<10)
			for {
				n, err := client.Read(buf)
				if n > 0 {
					p.mu.Lock()
					if p.drop != nil && bytes.Contains(buf[:n], p.drop) {
						p.drop = nil
						doomed <- struct{}{}
					}
					p.mu.Unlock()
					if _, werr := server.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
		go func() { // server -> client
			defer p.wg.Done()
			defer p.untrack(client)
			buf := make([]byte, 64<<10)
			for {
				n, err := server.Read(buf)
				if n > 0 {
					select {
					case <-doomed:
						_ = server.Close()
						return // the reply is lost
					default:
					}
					if _, werr := client.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}
