package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/embedetcd"
	"github.com/spate-go/spate/storeurl"
	// The drivers register their URL schemes with storeurl.
	_ "github.com/spate-go/spate/stores/etcd"
	_ "github.com/spate-go/spate/stores/mem"
	_ "github.com/spate-go/spate/stores/nats"
	_ "github.com/spate-go/spate/stores/redis"
)

// Environment variables read when the matching flags are empty, so secrets
// need not appear on the command line.
const (
	envPassword = "SPATE_STORE_PASSWORD"
	envToken    = "SPATE_STORE_TOKEN"
)

// storeFlags select and reach a coordination store.
type storeFlags struct {
	url            string
	dataDir        string
	embedAddr      string
	caFile         string
	certFile       string
	keyFile        string
	user           string
	password       string
	passwordFile   string
	token          string
	tokenFile      string
	creds          string
	connectTimeout time.Duration
	// inProcess is set by connect when the store lives in this process
	// (mem://): nothing of it outlives the process.
	inProcess bool
}

func (f *storeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "store", "", "coordination store URL: mem://, etcd://host:port[,host:port...] (etcds:// for TLS),\nredis://[user:pass@]host:port[/db] (rediss:// for TLS), nats://host:port[,host:port...][?replicas=3] (tls:// for TLS);\nevery scheme takes ?ca_file=, cert_file=, key_file=, password_file=, token_file=\n(default: the embedded etcd at --embed-addr, started on --data-dir if nothing serves there)")
	fs.StringVar(&f.dataDir, "data-dir", filepath.Join(".spate", "etcd"), "data directory of the embedded etcd (default store only)")
	fs.StringVar(&f.embedAddr, "embed-addr", embedetcd.DefaultClientAddr, "loopback address of the embedded etcd (default store only); more spate processes join the one serving here")
	fs.StringVar(&f.caFile, "ca-file", "", "TLS: CA certificate (PEM) that verifies the store's server certificate")
	fs.StringVar(&f.certFile, "cert-file", "", "TLS: client certificate (PEM)")
	fs.StringVar(&f.keyFile, "key-file", "", "TLS: client key (PEM)")
	fs.StringVar(&f.user, "user", "", "store user name (etcd, redis ACL, NATS)")
	fs.StringVar(&f.password, "password", "", "store password (or --password-file, or $"+envPassword+")")
	fs.StringVar(&f.passwordFile, "password-file", "", "file holding the store password")
	fs.StringVar(&f.token, "token", "", "store auth token (NATS) (or --token-file, or $"+envToken+")")
	fs.StringVar(&f.tokenFile, "token-file", "", "file holding the store auth token (NATS)")
	fs.StringVar(&f.creds, "creds", "", "NATS credentials file")
	fs.DurationVar(&f.connectTimeout, "connect-timeout", 30*time.Second, "how long reaching the store may take at startup, every dial, retry and startup check included")
}

// dialTimeout bounds one dial of a store client: 5s, or the connect
// timeout when shorter.
func (f *storeFlags) dialTimeout() time.Duration {
	if f.connectTimeout > 0 {
		return min(storeurl.DefaultDialTimeout, f.connectTimeout)
	}
	return storeurl.DefaultDialTimeout
}

// options are the storeurl options the flags ask for: they take
// precedence over what the URL says.
func (f *storeFlags) options(log *slog.Logger) (storeurl.Options, error) {
	if (f.certFile == "") != (f.keyFile == "") {
		return storeurl.Options{}, errors.New("--cert-file and --key-file go together")
	}
	if f.password != "" && f.passwordFile != "" {
		return storeurl.Options{}, errors.New("--password and --password-file: give one")
	}
	if f.token != "" && f.tokenFile != "" {
		return storeurl.Options{}, errors.New("--token and --token-file: give one")
	}
	tlsCfg, err := storeurl.LoadTLS(nil, f.caFile, f.certFile, f.keyFile)
	if err != nil {
		return storeurl.Options{}, fmt.Errorf("--ca-file/--cert-file/--key-file: %w", err)
	}
	opts := storeurl.Options{
		Username:    f.user,
		Password:    storeurl.Secret{Value: f.password, File: f.passwordFile, Env: envPassword},
		Token:       storeurl.Secret{Value: f.token, File: f.tokenFile, Env: envToken},
		TLS:         tlsCfg,
		DialTimeout: f.dialTimeout(),
		Logger:      log,
	}
	if f.creds != "" {
		opts.Params = url.Values{"creds": {f.creds}}
	}
	return opts, nil
}

// validateJob checks a job name: every driver accepts 1–64 bytes of
// [A-Za-z0-9_-].
func validateJob(job string) error { return storeurl.ValidateJob(job) }

// connector is one store deployment, and the embedded etcd behind the
// default store.
type connector struct {
	dep      storeurl.Deployment
	info     storeurl.Info
	describe string // for people: where the store is
	log      *slog.Logger
	local    *embedetcd.Local // the default store
	// embedAddr and host are the default store's address and the process
	// that hosts it (as it recorded itself; storehost.go).
	embedAddr string
	host      *embedetcd.HostInfo
}

type connectMode uint8

const (
	// connectStart starts the embedded default store if nothing serves.
	connectStart connectMode = iota
	// connectExisting starts the embedded default store only from an
	// existing data directory (to read a job it holds).
	connectExisting
)

// connect opens the deployment the flags name (parsing its URL and
// reading its secret and TLS files, dialling nothing) and, for the
// default store, starts or joins the embedded etcd.
func (f *storeFlags) connect(ctx context.Context, log *slog.Logger, mode connectMode) (*connector, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if f.url == "" {
		return f.connectDefault(ctx, log, mode)
	}
	opts, err := f.options(log)
	if err != nil {
		return nil, err
	}
	dep, err := storeurl.Open(ctx, f.url, opts)
	if err != nil {
		return nil, err
	}
	info := dep.Info()
	f.inProcess = info.InProcess
	return &connector{dep: dep, info: info, describe: info.Description, log: log}, nil
}

func (f *storeFlags) connectDefault(ctx context.Context, log *slog.Logger, mode connectMode) (*connector, error) {
	opts := embedetcd.LocalOptions{DataDir: f.dataDir, ClientAddr: f.embedAddr, LogFile: f.dataDir + ".log"}
	if mode == connectExisting {
		if _, err := os.Stat(f.dataDir); err != nil {
			opts.NoStart = true
		}
	}
	local, err := embedetcd.StartOrJoin(ctx, opts)
	if errors.Is(err, embedetcd.ErrNotRunning) {
		return nil, fmt.Errorf("no spate store here: nothing serves %s and there is no data directory %s (run where you ran spate backfill, or pass --store/--data-dir)", f.embedAddr, f.dataDir)
	}
	if err != nil {
		return nil, fmt.Errorf("default store: %w (pass --store to use another store, or --embed-addr for another port)", err)
	}
	dep, err := storeurl.Open(ctx, "etcd://"+strings.TrimPrefix(local.Endpoint, "http://"),
		storeurl.Options{DialTimeout: f.dialTimeout(), Logger: log})
	if err != nil {
		local.Close()
		return nil, err
	}
	c := &connector{dep: dep, info: dep.Info(), log: log, local: local, embedAddr: f.embedAddr}
	c.describeDefault(ctx, f.dataDir)
	return c, nil
}

// close releases the connector (and stops a hosted embedded store).
func (c *connector) close() {
	_ = c.dep.Close()
	if c.local != nil {
		c.local.Close()
	}
}

// hosted reports whether this process hosts the embedded store.
func (c *connector) hosted() bool { return c.local != nil && c.local.Hosted() }

// shared refuses a store that no other process can reach: there is no job
// to find on it from here.
func (c *connector) shared() error {
	if c.info.InProcess {
		return fmt.Errorf("%s: there is nothing to inspect from another process", c.describe)
	}
	return nil
}

// connectShared connects, for a command that reads what other processes
// run (jobs, ui), to a store they can reach: the embedded default only
// from its existing data directory, never an in-process store.
func (f *storeFlags) connectShared(log *slog.Logger) (*connector, error) {
	conn, err := f.connect(context.Background(), log, connectExisting)
	if err != nil {
		return nil, err
	}
	if err := conn.shared(); err != nil {
		conn.close()
		return nil, err
	}
	return conn, nil
}

// open opens a store over namespace ns (a job) with ephemeral TTL ttl,
// retrying Retryable failures until the connect timeout: every attempt,
// dial and startup check included, ends by then (or by ctx's deadline, if
// sooner). An open that runs out of time fails with an [unreachableError].
func (c *connector) open(ctx context.Context, ns string, ttl, retryFor time.Duration) (spate.Store, error) {
	octx, cancel := context.WithTimeout(ctx, retryFor)
	defer cancel()
	backoff := 200 * time.Millisecond
	for {
		st, err := c.dep.Open(octx, ns, ttl)
		if err == nil {
			return st, nil
		}
		if timedOut(octx) {
			return nil, c.unreachable(retryFor, err)
		}
		if !spate.IsRetryable(err) || octx.Err() != nil {
			return nil, err
		}
		c.log.Warn("store unreachable; retrying", "store", c.describe, "error", err)
		select {
		case <-octx.Done():
			if errors.Is(octx.Err(), context.DeadlineExceeded) {
				return nil, c.unreachable(retryFor, err)
			}
			return nil, err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 3*time.Second)
	}
}

// timedOut reports whether ctx's deadline has passed, or is so close that
// a client timeout set to it (NATS sets its dial timeout so) fired first.
func timedOut(ctx context.Context) bool {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && ctx.Err() == nil && time.Until(dl) < 20*time.Millisecond
}

// unreachableError is a store that --connect-timeout ran out on.
type unreachableError struct {
	store   string
	timeout time.Duration
	hint    string
	last    error
}

func (e *unreachableError) Error() string {
	last := strings.TrimSuffix(e.last.Error(), ": "+spate.ErrRetryable.Error())
	return fmt.Sprintf("could not connect to %s: --connect-timeout %v elapsed%s; last error: %s", e.store, e.timeout, e.hint, last)
}

func (e *unreachableError) Unwrap() error { return e.last }

// unreachable is the error of a connect that ran out of time: it names
// the store and the timeout, and what to check.
func (c *connector) unreachable(timeout time.Duration, last error) error {
	hint := " (is the store running there, on its client port?)"
	if c.info.TLS {
		hint = " (is the store running there, on its client port, and does that port speak TLS?)"
	}
	return &unreachableError{store: c.describe, timeout: timeout, hint: hint, last: last}
}

// openError renders a failure of open for people: an unreachable store
// says so on its own; another failure is prefixed with the store.
func (c *connector) openError(err error) error {
	var u *unreachableError
	if errors.As(err, &u) {
		return err
	}
	return fmt.Errorf("open the store (%s): %w", c.describe, err)
}

// recordedTTL is the lease TTL a job was opened with, for stores that
// record it (Redis, NATS): opening the job with another TTL fails there.
// A store that cannot be read reports none; opening it says why.
func (c *connector) recordedTTL(ctx context.Context, job string) (time.Duration, bool) {
	ttl, ok, err := c.dep.RecordedTTL(ctx, job)
	return ttl, ok && err == nil
}

// readTTL is the TTL to open an existing job with, only to read or change
// it: its recorded TTL, else lease, fitted to the store's resolution and
// floor.
func (c *connector) readTTL(ctx context.Context, job string, lease time.Duration) time.Duration {
	ttl := lease
	if rec, ok := c.recordedTTL(ctx, job); ok {
		return rec
	}
	if r := c.info.TTLResolution; r > 0 {
		ttl = max(ttl.Round(r), r)
	}
	return max(ttl, c.info.MinTTL)
}

// liveWorkers counts the live workers of every job on the store, opening
// a store over each job once (kept in stores for the next count).
func (c *connector) liveWorkers(ctx context.Context, stores map[string]spate.Store) (int, error) {
	jobs, err := c.dep.Jobs(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, job := range jobs {
		st := stores[job]
		if st == nil {
			if st, err = c.dep.Open(ctx, job, c.readTTL(ctx, job, c.info.MinTTL)); err != nil {
				return 0, err
			}
			stores[job] = st
		}
		ids, err := spate.LiveWorkers(ctx, st)
		if err != nil {
			return 0, err
		}
		n += len(ids)
	}
	return n, nil
}

// redactStoreURL hides the secrets a store URL may carry, so that it can
// be printed, logged, recorded in a history file or put in a suggested
// command (see storeurl.Redact).
func redactStoreURL(raw string) string { return storeurl.Redact(raw) }
