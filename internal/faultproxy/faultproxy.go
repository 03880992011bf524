// Package faultproxy is a loopback TCP proxy that injects network faults
// between a client and a real server: added latency, cut connections
// (refusing new ones), a blackhole (connections stay open but nothing gets
// through — a partition where packets vanish), and a lost reply (a request
// reaches the server, its answer never reaches the client).
//
// Tests point their clients at [Proxy.Addr] instead of the server's address.
package faultproxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy forwards TCP connections from a loopback port to a target.
type Proxy struct {
	ln     net.Listener
	target string

	mu         sync.Mutex
	closed     bool
	blocked    bool          // refuse and cut
	blackhole  bool          // accept but pass nothing
	latency    time.Duration // added to every chunk, each direction
	dropReply  []byte        // arm: lose the reply to the next request holding it
	conns      map[net.Conn]struct{}
	released   chan struct{} // closed on Heal: wakes blackholed pipes
	wg         sync.WaitGroup
	faultCount int
}

// New starts a proxy to target (host:port) on a free loopback port. It is
// closed when t ends.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	p, err := Start(target)
	if err != nil {
		t.Fatalf("faultproxy: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// Start starts a proxy to target; Close stops it.
func Start(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, released: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the host:port clients dial.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Faults counts the faults applied so far (cut connections, lost replies).
func (p *Proxy) Faults() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.faultCount
}

// Block cuts every open connection and refuses new ones until Heal.
func (p *Proxy) Block() {
	p.mu.Lock()
	p.blocked = true
	p.faultCount += len(p.conns)
	conns := p.takeConns()
	p.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// Blackhole lets connections open but passes no byte either way until Heal:
// clients see timeouts, not errors.
func (p *Proxy) Blackhole() {
	p.mu.Lock()
	p.blackhole = true
	p.faultCount++
	p.mu.Unlock()
}

// SetLatency adds d before every chunk forwarded, in each direction.
func (p *Proxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	p.latency = d
	p.mu.Unlock()
}

// DropReplyTo arms the proxy once: the next client chunk containing pattern
// is forwarded, but the server's answer is discarded and the client's
// connection closed — a write that landed with its reply lost.
func (p *Proxy) DropReplyTo(pattern []byte) {
	p.mu.Lock()
	p.dropReply = bytes.Clone(pattern)
	p.mu.Unlock()
}

// Armed reports whether a DropReplyTo has not fired yet.
func (p *Proxy) Armed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropReply != nil
}

// Heal ends Block and Blackhole (latency stays until SetLatency(0)).
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.blocked = false
	if p.blackhole {
		p.blackhole = false
		close(p.released)
		p.released = make(chan struct{})
	}
	p.mu.Unlock()
}

// Close stops the proxy, cuts every connection and waits for its
// goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	conns := p.takeConns()
	close(p.released)
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
}

func (p *Proxy) takeConns() []net.Conn {
	out := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		out = append(out, c)
	}
	clear(p.conns)
	return out
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse := p.blocked || p.closed
		p.mu.Unlock()
		if refuse {
			in.Close()
			continue
		}
		out, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		if p.closed || p.blocked {
			p.mu.Unlock()
			in.Close()
			out.Close()
			continue
		}
		p.conns[in] = struct{}{}
		p.conns[out] = struct{}{}
		p.mu.Unlock()
		pair := &pair{in: in, out: out}
		p.wg.Add(2)
		go p.pipe(pair, out, in, true)
		go p.pipe(pair, in, out, false)
	}
}

// pair is one proxied connection; a lost reply cuts both halves.
type pair struct {
	in, out   net.Conn
	mu        sync.Mutex
	dropNext  bool // the server's next answer is to be lost
	closeOnce sync.Once
}

func (pr *pair) close() {
	pr.closeOnce.Do(func() {
		pr.in.Close()
		pr.out.Close()
	})
}

// pipe copies src to dst; request is true for the client-to-server half.
func (p *Proxy) pipe(pr *pair, dst, src net.Conn, request bool) {
	defer p.wg.Done()
	defer pr.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			chunk := buf[:n]
			if !p.pass(pr, chunk, request) {
				return
			}
			if _, werr := dst.Write(chunk); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			return
		}
	}
}

// pass applies the faults to one chunk: it waits out latency and any
// blackhole, and reports false if the connection must be cut.
func (p *Proxy) pass(pr *pair, chunk []byte, request bool) bool {
	for {
		p.mu.Lock()
		hole, released, lat, closed := p.blackhole, p.released, p.latency, p.closed
		if !hole && !closed && request && p.dropReply != nil && bytes.Contains(chunk, p.dropReply) {
			p.dropReply = nil
			p.faultCount++
			pr.mu.Lock()
			pr.dropNext = true
			pr.mu.Unlock()
		}
		p.mu.Unlock()
		if closed {
			return false
		}
		if hole {
			<-released // hold the bytes until Heal (or Close)
			continue
		}
		if lat > 0 {
			time.Sleep(lat)
		}
		if !request {
			pr.mu.Lock()
			drop := pr.dropNext
			pr.mu.Unlock()
			if drop {
				return false // the answer is lost; the client sees a cut
			}
		}
		return true
	}
}
