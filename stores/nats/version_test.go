package nats_test

import (
	"bufio"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/nats"
)

// startOldNATS is a fake server that speaks the NATS handshake as a 2.10
// server (INFO, then PONG for PING) and records every other protocol line, so
// the test can show the driver refuses it before any JetStream request.
func startOldNATS(t *testing.T, version string) (url string, lines func() []string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu   sync.Mutex
		seen []string
		wg   sync.WaitGroup
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				port := ln.Addr().(*net.TCPAddr).Port
				fmt.Fprintf(c, `INFO {"server_id":"FAKE","server_name":"fake","version":%q,"proto":1,"go":"go1.26","host":"127.0.0.1","port":%d,"headers":true,"max_payload":1048576,"jetstream":true}`+"\r\n", version, port)
				r := bufio.NewReader(c)
				for {
					_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
					l, err := r.ReadString('\n')
					if err != nil {
						return
					}
					l = strings.TrimSpace(l)
					switch {
					case l == "PING":
						fmt.Fprint(c, "PONG\r\n")
					case strings.HasPrefix(l, "CONNECT "), l == "PONG":
					default:
						mu.Lock()
						seen = append(seen, l)
						mu.Unlock()
					}
				}
			})
		}
	})
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	return "nats://" + ln.Addr().String(), func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), seen...)
	}
}

func TestOldServerVersionIsFatalEndToEnd(t *testing.T) {
	t.Parallel()
	url, lines := startOldNATS(t, "2.10.22")
	nc, err := natsgo.Connect(url, natsgo.Timeout(2*time.Second), natsgo.NoReconnect())
	require.NoError(t, err, "connect to the fake server")
	defer nc.Close()
	_, err = nats.New(t.Context(), nc, nats.Options{Job: "old", TTL: 5 * time.Second})
	require.True(t, spate.IsFatal(err), "New against nats-server 2.10.22: %v, want a Fatal error", err)
	for _, want := range []string{"2.10.22", nats.MinServerVersion, "upgrade"} {
		assert.ErrorContains(t, err, want, "the error says %q", want)
	}
	// Flush so any request New had sent would have reached the fake.
	_ = nc.FlushTimeout(time.Second)
	for _, l := range lines() {
		assert.False(t, strings.HasPrefix(l, "PUB") || strings.HasPrefix(l, "HPUB") || strings.HasPrefix(l, "SUB"),
			"the driver talked to a server it refuses: %q", l)
	}
	t.Logf("error: %v", err)
}
