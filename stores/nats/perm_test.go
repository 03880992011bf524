package nats_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/natsservers"
	spatenats "github.com/spate-go/spate/stores/nats"
)

// permCallCtx is the context of a call refused for a missing permission.
// Without the driver's error handler the call would wait for it to end;
// with it, the call fails on the server's refusal, the context still live.
// The tests judge that (the context's state when the call returned, and an
// error naming the permission), not the seconds the call took.
const permCallCtx = 30 * time.Second

// permServer starts a server whose only user has exactly the permissions
// of job, minus drop (subjects of either list).
func permServer(t *testing.T, job string, drop ...string) *natsservers.Server {
	t.Helper()
	pub, sub := spatenats.Permissions(job)
	keep := func(l []string) []string {
		l = slices.DeleteFunc(slices.Clone(l), func(s string) bool { return slices.Contains(drop, s) })
		if len(l) == 0 {
			// An empty allow list would allow everything.
			l = []string{"nothing.allowed"}
		}
		return l
	}
	p := &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: keep(pub)},
		Subscribe: &server.SubjectPermission{Allow: keep(sub)},
	}
	return natsservers.Start(t, natsservers.WithUserPassword("spate", "pw"), natsservers.WithPermissions(p))
}

// violations records the permission violations a connection is told of.
type violations struct {
	mu   sync.Mutex
	errs []error
}

func (v *violations) handler(_ *natsgo.Conn, _ *natsgo.Subscription, err error) {
	if errors.Is(err, natsgo.ErrPermissionViolation) {
		v.mu.Lock()
		v.errs = append(v.errs, err)
		v.mu.Unlock()
	}
}

func (v *violations) get() []error {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.errs)
}

// TestPermissionsSuffice runs every operation, watches included, as a user
// granted exactly [spatenats.Permissions]: nothing may be refused. A second
// store adopts the buckets the first created.
func TestPermissionsSuffice(t *testing.T) {
	t.Parallel()
	job := natsservers.NewJob()
	srv := permServer(t, job)
	var seen violations
	nc := srv.Connect(t, natsgo.ErrorHandler(seen.handler))
	opts := spatenats.Options{Job: job, TTL: ttl}
	s := open(t, nc, opts)
	ctx := testCtx(t, 20*time.Second)
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		w, err := s.Watch(ctx, ks, "p.")
		require.NoError(t, err, "%v watch", ks)
		ev := <-w
		require.Equal(t, spate.WatchSnapshotDone, ev.Kind, "%v watch: want SnapshotDone first, got %+v", ks, ev)
		// A key watch of two keys: its consumer has several filter
		// subjects, which nats.go creates on another API subject.
		kw, err := s.WatchKeys(ctx, ks, []string{"p.k", "p.j"})
		require.NoError(t, err, "%v watch-keys", ks)
		ev = <-kw
		require.Equal(t, spate.WatchSnapshotDone, ev.Kind, "%v watch-keys: want SnapshotDone first, got %+v", ks, ev)
		o, err := s.Create(ctx, ks, "p.k", []byte("v1"))
		require.NoError(t, err, "%v create", ks)
		require.True(t, o.Won, "%v create: won=%t", ks, o.Won)
		o, err = s.Update(ctx, ks, "p.k", []byte("v2"), o.Revision)
		require.NoError(t, err, "%v update", ks)
		require.True(t, o.Won, "%v update: won=%t", ks, o.Won)
		e, ok, err := s.Get(ctx, ks, "p.k")
		require.NoError(t, err, "%v get", ks)
		require.True(t, ok, "%v get: %+v ok=%t", ks, e, ok)
		require.Equal(t, "v2", string(e.Value), "%v get: %+v", ks, e)
		l, err := s.List(ctx, ks, "p.")
		require.NoError(t, err, "%v list", ks)
		require.Len(t, l, 1, "%v list", ks)
		d, err := s.Delete(ctx, ks, "p.k", o.Revision)
		require.NoError(t, err, "%v delete", ks)
		require.True(t, d.Won, "%v delete: won=%t", ks, d.Won)
		// Watches coalesce: the puts may be skipped, not the delete.
		for _, w := range []<-chan spate.WatchEvent{w, kw} {
			deleted := false
			for ev := range w {
				require.NotEqual(t, spate.WatchError, ev.Kind, "%v watch: %v", ks, ev.Err)
				if deleted = ev.Kind == spate.WatchDelete; deleted {
					break
				}
			}
			require.True(t, deleted, "%v watch: ended without the delete", ks)
		}
	}
	s2 := open(t, nc, opts)
	roundTrip(t, s2)
	// Round trips on the connection so that a late violation has arrived.
	require.NoError(t, nc.FlushWithContext(ctx))
	require.Empty(t, seen.get(), "the permission list is not enough")
}

// TestMissingPermissionFailsOpen: a user missing one permission New needs
// gets a Fatal error that names it at once, not a timeout.
func TestMissingPermissionFailsOpen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		drop string // a subject of the list; "{d}" is the durable bucket
		says string
	}{
		{"$JS.API.INFO", `publish permission on "$JS.API.INFO"`},
		{"_INBOX.>", `subscribe permission on "_INBOX.>"`},
		{"$JS.API.STREAM.CREATE.KV_{d}", `publish permission on "$JS.API.STREAM.CREATE.KV_{d}"`},
		{"$JS.API.STREAM.INFO.KV_{d}", `publish permission on "$JS.API.STREAM.INFO.KV_{d}"`},
		// New's probe publishes to the bucket (and stores nothing).
		{"$KV.{d}.>", `publish permission on "$KV.{d}.>"`},
	} {
		t.Run(tc.drop, func(t *testing.T) {
			t.Parallel()
			job := natsservers.NewJob()
			d, _ := spatenats.Buckets(job)
			drop := strings.ReplaceAll(tc.drop, "{d}", d)
			srv := permServer(t, job, drop)
			nc := srv.Connect(t)
			ctx := testCtx(t, permCallCtx)
			start := time.Now()
			_, err := spatenats.New(ctx, nc, spatenats.Options{Job: job, TTL: ttl})
			took := time.Since(start)
			assert.NoError(t, ctx.Err(), "open returned only when its context ended (after %v): a missing permission must fail it", took)
			t.Logf("open without %s, after %v: %v", drop, took, err)
			requireFatal(t, "open without "+drop, err, "permission denied", strings.ReplaceAll(tc.says, "{d}", d))
		})
	}
}

// TestMissingPermissionFailsCall: a permission only a later call needs
// (reads, watches; New's probe already writes to the bucket) fails that call fast with a Fatal
// error that names it.
func TestMissingPermissionFailsCall(t *testing.T) {
	t.Parallel()
	watchErr := func(ctx context.Context, s spate.Store) error {
		w, err := s.Watch(ctx, spate.Durable, "")
		if err != nil {
			return err
		}
		for ev := range w {
			if ev.Kind == spate.WatchError {
				return ev.Err
			}
		}
		return errors.New("the watch ended without an error")
	}
	for _, tc := range []struct {
		drop string // a subject of the list; "{d}" is the durable bucket
		call func(ctx context.Context, s spate.Store) error
	}{
		{"$JS.API.STREAM.MSG.GET.KV_{d}", func(ctx context.Context, s spate.Store) error {
			_, _, err := s.Get(ctx, spate.Durable, "k")
			return err
		}},
		{"$JS.API.CONSUMER.CREATE.KV_{d}.>", watchErr},
		{"$JS.API.CONSUMER.MSG.NEXT.KV_{d}.*", watchErr},
	} {
		t.Run(tc.drop, func(t *testing.T) {
			t.Parallel()
			job := natsservers.NewJob()
			d, _ := spatenats.Buckets(job)
			drop := strings.ReplaceAll(tc.drop, "{d}", d)
			srv := permServer(t, job, drop)
			s := open(t, srv.Connect(t), spatenats.Options{Job: job, TTL: ttl})
			ctx := testCtx(t, permCallCtx)
			start := time.Now()
			err := tc.call(ctx, s)
			took := time.Since(start)
			assert.NoError(t, ctx.Err(), "the call returned only when its context ended (after %v): a missing permission must fail it", took)
			t.Logf("without %s, after %v: %v", drop, took, err)
			requireFatal(t, "call without "+drop, err, "permission denied", fmt.Sprintf("publish permission on %q", drop))
		})
	}
}

// TestPermissionsDocumented: the server configuration in the package
// documentation parses, and grants exactly Permissions("myjob").
func TestPermissionsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	var conf []string
	in := false
	for _, line := range strings.Split(string(doc), "\n") {
		code, ok := strings.CutPrefix(line, "//\t")
		switch {
		case !in && ok && code == "authorization {":
			in = true
		case in && !ok:
			t.Fatal("the authorization block in doc.go does not end")
		}
		if in {
			conf = append(conf, code)
			if code == "}" {
				break
			}
		}
	}
	require.NotEmpty(t, conf, "doc.go has no authorization block")
	file := filepath.Join(t.TempDir(), "nats.conf")
	require.NoError(t, os.WriteFile(file, []byte(strings.Join(conf, "\n")+"\n"), 0o600))
	o, err := server.ProcessConfigFile(file)
	require.NoError(t, err, "the documented configuration does not parse")
	require.Len(t, o.Users, 1, "the documented configuration has no user with permissions: %+v", o.Users)
	require.NotNil(t, o.Users[0].Permissions, "the documented configuration has no user with permissions: %+v", o.Users)
	p := o.Users[0].Permissions
	pub, sub := spatenats.Permissions("myjob")
	if assert.NotNil(t, p.Publish, "documented publish permissions, want allow %q", pub) {
		assert.Equal(t, pub, p.Publish.Allow, "documented publish permissions %+v", p.Publish)
		assert.Empty(t, p.Publish.Deny, "documented publish permissions %+v, want allow %q", p.Publish, pub)
	}
	if assert.NotNil(t, p.Subscribe, "documented subscribe permissions, want allow %q", sub) {
		assert.Equal(t, sub, p.Subscribe.Allow, "documented subscribe permissions %+v", p.Subscribe)
		assert.Empty(t, p.Subscribe.Deny, "documented subscribe permissions %+v, want allow %q", p.Subscribe, sub)
	}
}

// TestWatchWithoutConsumerInfoRunsUnguarded: a user without the
// CONSUMER.INFO permission (the list before watches asked it) keeps
// working watches: the refused probes of the stall guard neither break an
// idle watch nor fail the store's other calls; the watch logs once which
// permission would let it tell a stalled consumer from a quiet job.
func TestWatchWithoutConsumerInfoRunsUnguarded(t *testing.T) {
	t.Parallel()
	job := natsservers.NewJob()
	d, _ := spatenats.Buckets(job)
	drop := "$JS.API.CONSUMER.INFO.KV_" + d + ".*"
	srv := permServer(t, job, drop)
	var seen violations
	nc := srv.Connect(t, natsgo.ErrorHandler(seen.handler))
	var logs syncBuffer
	s := open(t, nc, spatenats.Options{Job: job, TTL: ttl,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	ctx := testCtx(t, 60*time.Second)
	w, err := s.Watch(ctx, spate.Durable, "ui.")
	require.NoError(t, err)
	require.Equal(t, spate.WatchSnapshotDone, recv(t, w, "the snapshot").Kind)
	// Idle until the server has refused a probe, and for as long again as
	// the guard needs to break a watch: the watch must still be open.
	for len(seen.get()) == 0 {
		select {
		case ev := <-w:
			t.Fatalf("an idle watch without CONSUMER.INFO sent %+v", ev)
		case <-time.After(10 * time.Millisecond):
		}
		require.NoError(t, ctx.Err(), "the server never refused a probe")
	}
	select {
	case ev := <-w:
		t.Fatalf("an idle watch without CONSUMER.INFO sent %+v", ev)
	case <-time.After(spatenats.WatchStallBound):
	}
	mustCreate(t, ctx, s, spate.Durable, "ui.k")
	ev := recv(t, w, "the write after the refused probes")
	require.Equal(t, spate.WatchPut, ev.Kind, "%+v", ev)
	require.Equal(t, "ui.k", ev.Key)
	assert.Contains(t, logs.String(), "CONSUMER.INFO", "the watch says which permission it lacks")
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
