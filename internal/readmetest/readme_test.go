// Package readmetest runs the README's Go snippets, and fails when a
// snippet in the README is not, line for line, the code run here.
package readmetest

import (
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/conformance/live"
	server "github.com/spate-go/spate/internal/redisservers"
	"github.com/spate-go/spate/stores/etcd/etcdtest"
	"github.com/spate-go/spate/stores/nats/natstest"
	"github.com/spate-go/spate/stores/redis/redistest"
	"github.com/spate-go/spate/storeurl"

	"github.com/spate-go/spate/stores/redis" // and redis:// for the live harness
)

// The README's three one-liners, as written.

func TestEtcd(t *testing.T)  { conformance.RunStore(t, etcdtest.Start(t).HarnessMaker(2*time.Second)) }
func TestRedis(t *testing.T) { conformance.RunStore(t, redistest.Start(t).HarnessMaker(2*time.Second)) }
func TestNATS(t *testing.T)  { conformance.RunStore(t, natstest.Start(t).HarnessMaker(2*time.Second)) }

// The README's live-deployment snippet, as written, against a Redis
// server the test starts with the append-only file, reached as a user
// holding exactly the ACL the driver's documentation prints
// (redis.ACLRules). Every store and coordinator rule passes, push watches
// included, and the server's ACL LOG shows nothing denied. SPATE_STORE_URL,
// when set, is used as is.
func TestMyDeployment(t *testing.T) {
	if os.Getenv("SPATE_STORE_URL") == "" {
		srv := server.Start(t, server.WithAOF(), server.WithUser("spate", "secret", redis.ACLRules()...))
		admin := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
		t.Cleanup(func() {
			defer admin.Close()
			denied, err := admin.Do(context.Background(), "ACL", "LOG").Slice()
			require.NoError(t, err)
			assert.Empty(t, denied, "the documented ACL denied the driver something")
		})
		t.Setenv("SPATE_STORE_URL", "redis://spate:secret@"+srv.Addr())
	}
	mk := live.Harness(t, os.Getenv("SPATE_STORE_URL"), 3*time.Second, storeurl.Options{})
	conformance.RunStore(t, mk)
	conformance.RunCoordinator(t, mk)
}

// Every line of the README's Go snippets that calls the conformance suite
// is a line of this file: a README snippet cannot drift from the code run.
func TestREADMESnippetsAreTheCodeRun(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	self, err := os.ReadFile("readme_test.go")
	require.NoError(t, err)
	code := map[string]bool{}
	for _, l := range strings.Split(string(self), "\n") {
		code[strings.TrimSpace(l)] = true
	}
	blocks := regexp.MustCompile("(?s)```go\n(.*?)```").FindAllStringSubmatch(string(readme), -1)
	checked := 0
	for _, b := range blocks {
		if !strings.Contains(b[1], "etcdtest.Start") && !strings.Contains(b[1], "live.Harness") && !strings.Contains(b[1], "redistest.Start") {
			continue
		}
		for _, l := range strings.Split(b[1], "\n") {
			if l = strings.TrimSpace(l); l != "" {
				require.True(t, code[l], "README line %q is not code this test runs", l)
				checked++
			}
		}
	}
	require.GreaterOrEqual(t, checked, 8, "the README's conformance snippets were not found")
}

// The README's count of store rules is the suite's.
func TestREADMECountsTheStoreRules(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	m := regexp.MustCompile(`// (\d+) store rules`).FindSubmatch(readme)
	require.NotNil(t, m, "the README no longer counts the store rules")
	require.Equal(t, strconv.Itoa(len(conformance.StoreRules)), string(m[1]))
}
