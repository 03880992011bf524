package embedetcd

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/spate-go/spate/internal/freeport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func client(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// The first caller starts and hosts the server; a second one on the same
// address joins it; after the host stops, NoStart finds nothing, and a new
// start reads the data back from the directory.
func TestStartOrJoin(t *testing.T) {
	ctx := t.Context()
	opts := LocalOptions{DataDir: filepath.Join(t.TempDir(), "etcd"), ClientAddr: "127.0.0.1:" + strconv.Itoa(freeport.WithOffset(t, 10))}
	host, err := StartOrJoin(ctx, opts)
	require.NoError(t, err)
	defer host.Close()
	require.True(t, host.Hosted(), "the first caller must host the server on %s", opts.DataDir)
	require.Equal(t, opts.DataDir, host.DataDir, "the first caller must host the server")
	joiner, err := StartOrJoin(ctx, opts)
	require.NoError(t, err)
	require.False(t, joiner.Hosted(), "the second caller must join %s", host.Endpoint)
	require.Equal(t, host.Endpoint, joiner.Endpoint, "the second caller must join")
	joiner.Close() // a joiner's Close stops nothing
	_, err = client(t, joiner.Endpoint).Put(ctx, "k", "v")
	require.NoError(t, err, "write through the joiner's endpoint after its Close")
	host.Close()

	noStart := opts
	noStart.NoStart = true
	_, err = StartOrJoin(ctx, noStart)
	require.ErrorIs(t, err, ErrNotRunning, "NoStart with nothing serving")
	again, err := StartOrJoin(ctx, opts)
	require.NoError(t, err)
	defer again.Close()
	resp, err := client(t, again.Endpoint).Get(ctx, "k")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "the restarted server lost its data")
	require.Equal(t, "v", string(resp.Kvs[0].Value), "the restarted server lost its data")
}

// Something other than etcd on the address is refused with ErrNotEtcd.
func TestStartOrJoinRefusesAForeignListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	defer func() {
		_ = srv.Close()
		<-done
	}()
	_, err = StartOrJoin(t.Context(), LocalOptions{DataDir: filepath.Join(t.TempDir(), "etcd"), ClientAddr: ln.Addr().String()})
	require.ErrorIs(t, err, ErrNotEtcd)
}

// A process holding the data directory's lock is starting the server: a
// second caller waits for it to answer and joins instead of starting a
// second member on the same data.
func TestStartOrJoinWaitsForTheLockHolder(t *testing.T) {
	dir := t.TempDir()
	port := freeport.WithOffset(t, 10)
	opts := LocalOptions{DataDir: filepath.Join(dir, "etcd"), ClientAddr: "127.0.0.1:" + strconv.Itoa(port), JoinTimeout: 30 * time.Second}
	lock, err := os.OpenFile(opts.DataDir+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	require.NoError(t, err)
	defer lock.Close()
	got, err := tryLockFile(lock)
	require.NoError(t, err, "take the lock")
	require.True(t, got, "take the lock")
	type result struct {
		l   *Local
		err error
	}
	res := make(chan result, 1)
	go func() {
		l, err := StartOrJoin(context.Background(), opts)
		res <- result{l, err}
	}()
	// The lock holder starts the server (on another data directory: the
	// waiter must not care which).
	e, err := Start(Member{
		Dir:       filepath.Join(dir, "holder"),
		ClientURL: url.URL{Scheme: "http", Host: opts.ClientAddr},
		PeerURL:   url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(port+10)},
	})
	require.NoError(t, err)
	defer e.Close()
	r := <-res
	require.NoError(t, r.err, "the waiter failed")
	hosted := r.l.Hosted()
	if hosted {
		r.l.Close()
	}
	require.False(t, hosted, "the waiter started a second member instead of joining")
	_, err = os.Stat(opts.DataDir)
	require.True(t, os.IsNotExist(err), "the waiter touched the locked data directory: %v", err)
}

// The default store's lone member runs a lone member's short raft timing
// (it serves only once it elected itself, which production timing delays
// by up to a second); its lease floor drops to one second with it, below
// the two seconds spate keeps for the default store.
func TestStartOrJoinHostsALoneMemberWithShortElections(t *testing.T) {
	opts := LocalOptions{DataDir: filepath.Join(t.TempDir(), "etcd"), ClientAddr: "127.0.0.1:" + strconv.Itoa(freeport.WithOffset(t, 10))}
	host, err := StartOrJoin(t.Context(), opts)
	require.NoError(t, err)
	defer host.Close()
	require.True(t, host.Hosted())
	cfg := host.etcd.Config()
	assert.EqualValues(t, LocalTickMs, cfg.TickMs)
	assert.EqualValues(t, LocalElectionMs, cfg.ElectionMs)
	g, err := client(t, host.Endpoint).Grant(t.Context(), 1)
	require.NoError(t, err)
	assert.EqualValues(t, 1, g.TTL, "the server's minimum lease TTL (1.5 election timeouts, whole seconds)")
}
