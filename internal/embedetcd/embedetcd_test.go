package embedetcd

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/spate-go/spate/internal/freeport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func client(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
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
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	if !host.Hosted() || host.DataDir != opts.DataDir {
		t.Fatalf("the first caller must host the server on %s, got hosted=%v dir=%q", opts.DataDir, host.Hosted(), host.DataDir)
	}
	joiner, err := StartOrJoin(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	if joiner.Hosted() || joiner.Endpoint != host.Endpoint {
		t.Fatalf("the second caller must join %s, got hosted=%v endpoint=%s", host.Endpoint, joiner.Hosted(), joiner.Endpoint)
	}
	joiner.Close() // a joiner's Close stops nothing
	if _, err := client(t, joiner.Endpoint).Put(ctx, "k", "v"); err != nil {
		t.Fatalf("write through the joiner's endpoint after its Close: %v", err)
	}
	host.Close()

	noStart := opts
	noStart.NoStart = true
	if _, err := StartOrJoin(ctx, noStart); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("NoStart with nothing serving: got %v, want ErrNotRunning", err)
	}
	again, err := StartOrJoin(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	resp, err := client(t, again.Endpoint).Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("the restarted server lost its data: %v", resp.Kvs)
	}
}

// Something other than etcd on the address is refused with ErrNotEtcd.
func TestStartOrJoinRefusesAForeignListener(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
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
	if !errors.Is(err, ErrNotEtcd) {
		t.Fatalf("got %v, want ErrNotEtcd", err)
	}
}

// A process holding the data directory's lock is starting the server: a
// second caller waits for it to answer and joins instead of starting a
// second member on the same data.
func TestStartOrJoinWaitsForTheLockHolder(t *testing.T) {
	dir := t.TempDir()
	port := freeport.WithOffset(t, 10)
	opts := LocalOptions{DataDir: filepath.Join(dir, "etcd"), ClientAddr: "127.0.0.1:" + strconv.Itoa(port), JoinTimeout: 30 * time.Second}
	lock, err := os.OpenFile(opts.DataDir+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if got, err := tryLockFile(lock); err != nil || !got {
		t.Fatalf("take the lock: %v %v", got, err)
	}
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
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	r := <-res
	if r.err != nil {
		t.Fatalf("the waiter failed: %v", r.err)
	}
	if r.l.Hosted() {
		r.l.Close()
		t.Fatal("the waiter started a second member instead of joining")
	}
	if _, err := os.Stat(opts.DataDir); !os.IsNotExist(err) {
		t.Fatalf("the waiter touched the locked data directory: %v", err)
	}
}
