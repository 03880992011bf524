package natsservers

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
)

// VersionProxy listens on a loopback port and relays clients to target (a
// host:port of a plaintext server), rewriting the version in every INFO the
// server sends to version: a real server that claims to be another release.
// It returns the proxy's nats:// URL and stops at cleanup.
func VersionProxy(t testing.TB, target, version string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("natsservers: proxy listen: %v", err)
	}
	p := &proxy{l: l, target: target, version: version, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	t.Cleanup(p.close)
	return "nats://" + l.Addr().String()
}

type proxy struct {
	l       net.Listener
	target  string
	version string
	wg      sync.WaitGroup

	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
}

func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *proxy) close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.l.Close()
	p.wg.Wait()
}

func (p *proxy) serve() {
	for {
		client, err := p.l.Accept()
		if err != nil {
			return
		}
		if !p.track(client) {
			return
		}
		p.wg.Go(func() { p.relay(client) })
	}
}

func (p *proxy) relay(client net.Conn) {
	defer client.Close()
	upstream, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(upstream) {
		return
	}
	defer upstream.Close()
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = io.Copy(upstream, client)
		_ = upstream.Close()
	})
	_ = p.serverToClient(bufio.NewReader(upstream), client)
	_ = client.Close()
	wg.Wait()
}

// serverToClient relays the server's protocol, rewriting every INFO (the
// server sends more than one, and the client keeps the latest version) and
// copying message payloads verbatim.
func (p *proxy) serverToClient(r *bufio.Reader, w io.Writer) error {
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return err
		}
		var payload int
		switch {
		case bytes.HasPrefix(line, []byte("INFO ")):
			line = p.rewrite(line)
		case bytes.HasPrefix(line, []byte("MSG ")), bytes.HasPrefix(line, []byte("HMSG ")):
			// The last field is the payload size (headers included).
			f := bytes.Fields(line)
			n, err := strconv.Atoi(string(f[len(f)-1]))
			if err != nil {
				return err
			}
			payload = n + 2 // and its CRLF
		}
		if _, err := w.Write(line); err != nil {
			return err
		}
		if payload > 0 {
			if _, err := io.CopyN(w, r, int64(payload)); err != nil {
				return err
			}
		}
	}
}

// rewrite replaces the version of an INFO line.
func (p *proxy) rewrite(line []byte) []byte {
	body, ok := bytes.CutPrefix(line, []byte("INFO "))
	if !ok {
		return line
	}
	var info map[string]any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&info); err != nil {
		return line
	}
	info["version"] = p.version
	out, err := json.Marshal(info)
	if err != nil {
		return line
	}
	return append(append([]byte("INFO "), out...), '\r', '\n')
}
