package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/embedetcd"
	"github.com/spate-go/spate/stores/etcd"
	"github.com/spate-go/spate/stores/mem"
	"github.com/spate-go/spate/stores/redis"
)

// Environment variables read when the matching flag is empty, so secrets
// need not appear on the command line.
const (
	envPassword = "SPATE_STORE_PASSWORD"
	envToken    = "SPATE_STORE_TOKEN"
)

// etcdJobRoot is where jobs live in etcd: every job's keys are under
// etcdJobRoot + job + "/".
const etcdJobRoot = "/spate/"

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
	token          string
	creds          string
	connectTimeout time.Duration
}

func (f *storeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.url, "store", "", "coordination store URL: mem://, etcd://host:port[,host:port...], redis://[user:pass@]host:port[/db], rediss://...,\nnats://host:port[,nats://host:port...][?replicas=3] (tls:// for TLS)\n(default: the embedded etcd at --embed-addr, started on --data-dir if nothing serves there)")
	fs.StringVar(&f.dataDir, "data-dir", filepath.Join(".spate", "etcd"), "data directory of the embedded etcd (default store only)")
	fs.StringVar(&f.embedAddr, "embed-addr", embedetcd.DefaultClientAddr, "loopback address of the embedded etcd (default store only); more spate processes join the one serving here")
	fs.StringVar(&f.caFile, "ca-file", "", "TLS: CA certificate (PEM) that verifies the store's server certificate")
	fs.StringVar(&f.certFile, "cert-file", "", "TLS: client certificate (PEM)")
	fs.StringVar(&f.keyFile, "key-file", "", "TLS: client key (PEM)")
	fs.StringVar(&f.user, "user", "", "store user name (etcd, redis ACL)")
	fs.StringVar(&f.password, "password", "", "store password (or $"+envPassword+")")
	fs.StringVar(&f.token, "token", "", "store auth token (NATS) (or $"+envToken+")")
	fs.StringVar(&f.creds, "creds", "", "NATS credentials file")
	fs.DurationVar(&f.connectTimeout, "connect-timeout", 30*time.Second, "how long reaching the store may take at startup, every dial, retry and startup check included")
}

// dialTimeout bounds one dial of a store client: 5s, or the connect
// timeout when shorter.
func (f *storeFlags) dialTimeout() time.Duration {
	if f.connectTimeout > 0 {
		return min(5*time.Second, f.connectTimeout)
	}
	return 5 * time.Second
}

func (f *storeFlags) secret() (password, token string) {
	password, token = f.password, f.token
	if password == "" {
		password = os.Getenv(envPassword)
	}
	if token == "" {
		token = os.Getenv(envToken)
	}
	return password, token
}

// tlsConfig is the client TLS configuration the flags ask for, nil when
// they ask for none.
func (f *storeFlags) tlsConfig() (*tls.Config, error) {
	if f.caFile == "" && f.certFile == "" && f.keyFile == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.caFile != "" {
		pem, err := os.ReadFile(f.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca-file %s holds no PEM certificate", f.caFile)
		}
		cfg.RootCAs = pool
	}
	if (f.certFile == "") != (f.keyFile == "") {
		return nil, errors.New("--cert-file and --key-file go together")
	}
	if f.certFile != "" {
		pair, err := tls.LoadX509KeyPair(f.certFile, f.keyFile)
		if err != nil {
			return nil, fmt.Errorf("--cert-file/--key-file: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

var jobSyntax = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// validateJob checks a job name: every driver accepts 1–64 bytes of
// [A-Za-z0-9_-].
func validateJob(job string) error {
	if !jobSyntax.MatchString(job) {
		return fmt.Errorf("job name %q must be 1-64 characters of [A-Za-z0-9_-]", job)
	}
	return nil
}

// connector reaches one store deployment and opens stores over namespaces
// (jobs) of it.
type connector struct {
	kind     string // "mem", "etcd", "redis" (and "nats")
	describe string // for people: where the store is
	log      *slog.Logger
	tls      bool // the store is reached over TLS

	etcdCfg  clientv3.Config
	local    *embedetcd.Local // the default store
	redisOpt *goredis.Options
	natsConn *natsConnector

	memMu sync.Mutex
	mems  map[string]*mem.Store // mem://: one in-process backend per namespace
}

type connectMode uint8

const (
	// connectStart starts the embedded default store if nothing serves.
	connectStart connectMode = iota
	// connectExisting starts the embedded default store only from an
	// existing data directory (to read a job it holds).
	connectExisting
)

// connect parses the store flags and, for the default store, starts or
// joins the embedded etcd.
func (f *storeFlags) connect(ctx context.Context, log *slog.Logger, mode connectMode) (*connector, error) {
	tlsCfg, err := f.tlsConfig()
	if err != nil {
		return nil, err
	}
	password, token := f.secret()
	c := &connector{log: log, mems: map[string]*mem.Store{}}
	raw := f.url
	if raw == "" {
		return f.connectDefault(ctx, c, mode)
	}
	shown := redactStoreURL(raw)
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, fmt.Errorf("--store %q: want a URL such as etcd://127.0.0.1:2379, redis://127.0.0.1:6379 or mem://", shown)
	}
	switch strings.ToLower(scheme) {
	case "mem":
		c.kind = "mem"
		c.describe = "in-process memory store (mem://): this process only"
		return c, nil
	case "etcd":
		c.kind = "etcd"
		hosts, auth := strings.TrimSuffix(rest, "/"), ""
		if i := strings.LastIndexByte(hosts, '@'); i >= 0 {
			auth, hosts = hosts[:i], hosts[i+1:]
		}
		user, pass := f.user, password
		if auth != "" {
			u, p, _ := strings.Cut(auth, ":")
			if user == "" {
				user, _ = url.PathUnescape(u)
			}
			if pass == "" {
				pass, _ = url.PathUnescape(p)
			}
		}
		sch := "http://"
		if tlsCfg != nil {
			sch = "https://"
		}
		var eps []string
		for h := range strings.SplitSeq(hosts, ",") {
			if h = strings.TrimSpace(h); h != "" {
				eps = append(eps, sch+h)
			}
		}
		if len(eps) == 0 {
			return nil, fmt.Errorf("--store %q names no etcd endpoint", shown)
		}
		c.tls = tlsCfg != nil
		c.etcdCfg = clientv3.Config{Endpoints: eps, DialTimeout: f.dialTimeout(), TLS: tlsCfg,
			Username: user, Password: pass, Logger: zap.NewNop(), DialOptions: etcd.DialOptions()}
		c.describe = "etcd at " + strings.Join(eps, ",")
		return c, nil
	case "redis", "rediss":
		c.kind = "redis"
		o, err := goredis.ParseURL(raw)
		if err != nil {
			// go-redis errors may quote the URL: name the redacted one.
			return nil, fmt.Errorf("--store %q: not a Redis URL (redis://[user:password@]host:port[/db])", shown)
		}
		if f.user != "" {
			o.Username = f.user
		}
		if password != "" {
			o.Password = password
		}
		if tlsCfg != nil {
			if o.TLSConfig == nil {
				return nil, errors.New("--store: TLS flags need a rediss:// URL")
			}
			o.TLSConfig.RootCAs = tlsCfg.RootCAs
			o.TLSConfig.Certificates = tlsCfg.Certificates
		}
		o.ContextTimeoutEnabled = true
		o.DialTimeout = f.dialTimeout()
		c.tls = o.TLSConfig != nil
		c.redisOpt = o
		c.describe = scheme + "://" + o.Addr
		if o.DB != 0 {
			c.describe += "/" + strconv.Itoa(o.DB)
		}
		return c, nil
	case "nats", "tls":
		n, err := newNatsConnector(raw, tlsCfg, f.user, password, token, f.creds)
		if err != nil {
			return nil, err
		}
		c.kind = "nats"
		c.tls = tlsCfg != nil || strings.EqualFold(scheme, "tls")
		c.natsConn = n
		c.describe = n.describe()
		return c, nil
	}
	return nil, fmt.Errorf("--store %q: unknown scheme %q (want mem, etcd, redis, rediss%s)", shown, scheme, natsSchemes)
}

func (f *storeFlags) connectDefault(ctx context.Context, c *connector, mode connectMode) (*connector, error) {
	c.kind = "etcd"
	opts := embedetcd.LocalOptions{DataDir: f.dataDir, ClientAddr: f.embedAddr}
	if mode == connectExisting {
		if _, err := os.Stat(f.dataDir); err != nil {
			opts.NoStart = true
		}
	}
	if !opts.NoStart {
		lg, err := etcdFileLogger(f.dataDir + ".log")
		if err != nil {
			return nil, err
		}
		opts.Logger = lg
	}
	local, err := embedetcd.StartOrJoin(ctx, opts)
	if errors.Is(err, embedetcd.ErrNotRunning) {
		return nil, fmt.Errorf("no spate store here: nothing serves %s and there is no data directory %s (run where you ran spate backfill, or pass --store/--data-dir)", f.embedAddr, f.dataDir)
	}
	if err != nil {
		return nil, fmt.Errorf("default store: %w (pass --store to use another store, or --embed-addr for another port)", err)
	}
	c.local = local
	c.etcdCfg = clientv3.Config{Endpoints: []string{local.Endpoint}, DialTimeout: f.dialTimeout(), Logger: zap.NewNop(),
		DialOptions: etcd.DialOptions()}
	if local.Hosted() {
		c.describe = fmt.Sprintf("embedded etcd at %s, hosted by this process (data in %s)", f.embedAddr, f.dataDir)
	} else {
		c.describe = fmt.Sprintf("embedded etcd at %s, hosted by another spate process", f.embedAddr)
	}
	return c, nil
}

// etcdFileLogger sends the hosted etcd's warnings to a file.
func etcdFileLogger(path string) (*zap.Logger, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	cfg := zap.NewProductionConfig()
	cfg.Level = zap.NewAtomicLevelAt(zap.WarnLevel)
	cfg.OutputPaths = []string{path}
	cfg.ErrorOutputPaths = []string{path}
	cfg.Sampling = nil
	return cfg.Build()
}

// close releases the connector (and stops a hosted embedded store).
func (c *connector) close() {
	c.memMu.Lock()
	for _, m := range c.mems {
		_ = m.Close()
	}
	c.mems = nil
	c.memMu.Unlock()
	if c.local != nil {
		c.local.Close()
	}
	if c.natsConn != nil {
		c.natsConn.close()
	}
}

// hosted reports whether this process hosts the embedded store.
func (c *connector) hosted() bool { return c.local != nil && c.local.Hosted() }

// etcdPrefix is a job's key prefix in etcd.
func etcdPrefix(job string) string { return etcdJobRoot + job + "/" }

// openedStore is a store with the client it owns.
type openedStore struct {
	spate.Store
	closeClient func()
}

func (o *openedStore) Close() error {
	err := o.Store.Close()
	if o.closeClient != nil {
		o.closeClient()
	}
	return err
}

// open opens a store over namespace ns (a job) with ephemeral TTL ttl,
// retrying Retryable failures until the connect timeout: every attempt,
// dial and startup check included, ends by then (or by ctx's deadline, if
// sooner). An open that runs out of time fails with an [unreachableError].
func (c *connector) open(ctx context.Context, ns string, ttl, retryFor time.Duration) (*openedStore, error) {
	octx, cancel := context.WithTimeout(ctx, retryFor)
	defer cancel()
	backoff := 200 * time.Millisecond
	for {
		st, err := c.openOnce(octx, ns, ttl)
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
	if c.tls {
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

func (c *connector) openOnce(ctx context.Context, ns string, ttl time.Duration) (*openedStore, error) {
	switch c.kind {
	case "mem":
		c.memMu.Lock()
		defer c.memMu.Unlock()
		m := c.mems[ns]
		if m == nil {
			var err error
			if m, err = mem.New(mem.Options{TTL: ttl}); err != nil {
				return nil, err
			}
			c.mems[ns] = m
		}
		h, err := m.Connect()
		if err != nil {
			return nil, err
		}
		return &openedStore{Store: h}, nil
	case "etcd":
		cli, err := clientv3.New(c.etcdCfg)
		if err != nil {
			return nil, fmt.Errorf("etcd client: %w: %w", err, classOfClientError(err))
		}
		st, err := etcd.New(ctx, cli, etcd.Options{Prefix: etcdPrefix(ns), TTL: ttl, Logger: c.log})
		if err != nil {
			_ = cli.Close()
			return nil, err
		}
		return &openedStore{Store: st, closeClient: func() { _ = cli.Close() }}, nil
	case "redis":
		cli := goredis.NewClient(c.redisOpt)
		st, err := redis.New(ctx, cli, redis.Options{Job: ns, TTL: ttl, Logger: c.log})
		if err != nil {
			_ = cli.Close()
			return nil, err
		}
		return &openedStore{Store: st, closeClient: func() { _ = cli.Close() }}, nil
	case "nats":
		return c.natsConn.open(ctx, ns, ttl, c.log)
	}
	return nil, fmt.Errorf("unknown store kind %q", c.kind)
}

// classOfClientError classifies a failure to build an etcd client: refused
// credentials are Fatal (with what to fix); the rest (an endpoint that did
// not answer in time) Retryable.
func classOfClientError(err error) error {
	for _, fatal := range []error{rpctypes.ErrAuthFailed, rpctypes.ErrUserEmpty, rpctypes.ErrUserNotFound,
		rpctypes.ErrAuthNotEnabled, rpctypes.ErrInvalidAuthToken} {
		if errors.Is(rpctypes.Error(err), fatal) {
			return spate.ErrFatal
		}
	}
	return spate.ErrRetryable
}

// deleteNamespace removes every key of namespace ns (conformance cleanup).
func (c *connector) deleteNamespace(ctx context.Context, ns string) error {
	switch c.kind {
	case "mem":
		c.memMu.Lock()
		m := c.mems[ns]
		delete(c.mems, ns)
		c.memMu.Unlock()
		if m != nil {
			return m.Close()
		}
		return nil
	case "etcd":
		cli, err := clientv3.New(c.etcdCfg)
		if err != nil {
			return err
		}
		defer cli.Close()
		_, err = cli.Delete(ctx, etcdPrefix(ns), clientv3.WithPrefix())
		return err
	case "redis":
		cli := goredis.NewClient(c.redisOpt)
		defer cli.Close()
		pattern := "spate:{" + ns + "}:*"
		iter := cli.Scan(ctx, 0, pattern, 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			return fmt.Errorf("scan %s: %w", pattern, err)
		}
		for chunk := range slices.Chunk(keys, 500) {
			if err := cli.Del(ctx, chunk...).Err(); err != nil {
				return fmt.Errorf("delete %s: %w", pattern, err)
			}
		}
		return nil
	case "nats":
		return c.natsConn.deleteNamespace(ctx, ns)
	}
	return nil
}

// jobs lists the jobs the store holds.
func (c *connector) jobs(ctx context.Context) ([]string, error) {
	switch c.kind {
	case "mem":
		return nil, errors.New("a mem:// store lives inside one process: there is nothing to inspect from another")
	case "etcd":
		cli, err := clientv3.New(c.etcdCfg)
		if err != nil {
			return nil, err
		}
		defer cli.Close()
		// One key per step: jump from each job's prefix to the next job.
		var out []string
		from := etcdJobRoot
		end := clientv3.GetPrefixRangeEnd(etcdJobRoot)
		for {
			resp, err := cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
			if err != nil {
				return nil, err
			}
			if len(resp.Kvs) == 0 {
				break
			}
			rest := strings.TrimPrefix(string(resp.Kvs[0].Key), etcdJobRoot)
			job, _, _ := strings.Cut(rest, "/")
			if job == "" {
				break
			}
			plan, err := cli.Get(ctx, etcdPrefix(job)+"durable/plan", clientv3.WithCountOnly())
			if err != nil {
				return nil, err
			}
			if plan.Count > 0 {
				out = append(out, job)
			}
			from = clientv3.GetPrefixRangeEnd(etcdPrefix(job))
		}
		return out, nil
	case "redis":
		cli := goredis.NewClient(c.redisOpt)
		defer cli.Close()
		iter := cli.Scan(ctx, 0, "spate:{*}:meta", 1000).Iterator()
		var out []string
		for iter.Next(ctx) {
			k := iter.Val()
			if job, ok := strings.CutPrefix(k, "spate:{"); ok {
				out = append(out, strings.TrimSuffix(job, "}:meta"))
			}
		}
		slices.Sort(out)
		return out, iter.Err()
	case "nats":
		return c.natsConn.jobs(ctx)
	}
	return nil, nil
}

// recordedTTL is the lease TTL a job was opened with, for stores that
// record it (Redis, NATS): opening the job with another TTL fails there.
func (c *connector) recordedTTL(ctx context.Context, job string) (time.Duration, bool) {
	if c.kind == "nats" {
		return c.natsConn.recordedTTL(ctx, job)
	}
	if c.kind != "redis" {
		return 0, false
	}
	cli := goredis.NewClient(c.redisOpt)
	defer cli.Close()
	v, err := cli.HGet(ctx, "spate:{"+job+"}:meta", "ttl_ms").Int64()
	if err != nil || v <= 0 {
		return 0, false
	}
	return time.Duration(v) * time.Millisecond, true
}

// liveWorkers counts the workers of every job whose presence keys live in
// the embedded store (the host waits for them before stopping it).
func (c *connector) liveWorkers(ctx context.Context) (int, error) {
	cli, err := clientv3.New(c.etcdCfg)
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	resp, err := cli.Get(ctx, etcdJobRoot, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return 0, err
	}
	n := 0
	for _, kv := range resp.Kvs {
		if strings.Contains(string(kv.Key), "/ephemeral/worker.") {
			n++
		}
	}
	return n, nil
}

// watchWorkers sends (coalesced) whenever a worker presence key of any job
// in the etcd store appears or goes. The channel closes when ctx ends or
// the watch breaks.
func (c *connector) watchWorkers(ctx context.Context) (<-chan struct{}, error) {
	cli, err := clientv3.New(c.etcdCfg)
	if err != nil {
		return nil, err
	}
	out := make(chan struct{}, 1)
	wch := cli.Watch(ctx, etcdJobRoot, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	go func() {
		defer close(out)
		defer cli.Close()
		for resp := range wch {
			if resp.Err() != nil {
				return
			}
			for _, ev := range resp.Events {
				if strings.Contains(string(ev.Kv.Key), "/ephemeral/worker.") {
					select {
					case out <- struct{}{}:
					default:
					}
					break
				}
			}
		}
	}()
	return out, nil
}

// jobExists reports whether the store holds job (without opening a store
// over it, which on Redis would record the job).
func (c *connector) jobExists(ctx context.Context, job string) (bool, error) {
	switch c.kind {
	case "etcd":
		cli, err := clientv3.New(c.etcdCfg)
		if err != nil {
			return false, err
		}
		defer cli.Close()
		resp, err := cli.Get(ctx, etcdPrefix(job)+"durable/plan", clientv3.WithCountOnly())
		if err != nil {
			return false, err
		}
		return resp.Count > 0, nil
	case "redis":
		cli := goredis.NewClient(c.redisOpt)
		defer cli.Close()
		n, err := cli.Exists(ctx, "spate:{"+job+"}:meta").Result()
		return n > 0, err
	case "nats":
		return c.natsConn.jobExists(ctx, job)
	}
	return true, nil
}

// redactStoreURL hides the secrets a store URL may carry — a password, or
// a NATS token or user name standing alone before the '@' — in every
// server of a comma-separated list, so that the URL can be printed, logged,
// recorded in a history file or put in a suggested command. A user name
// with a password keeps the name.
func redactStoreURL(raw string) string {
	parts := strings.Split(raw, ",")
	for i, p := range parts {
		scheme, rest, hasScheme := strings.Cut(p, "://")
		if !hasScheme {
			scheme, rest = "", p
		}
		at := strings.LastIndexByte(strings.SplitN(rest, "/", 2)[0], '@')
		if at < 0 {
			continue
		}
		user, _, hasPass := strings.Cut(rest[:at], ":")
		cred := "xxxxx" // a token, or a lone name NATS reads as one
		if hasPass {
			cred = user + ":xxxxx"
		}
		rest = cred + rest[at:]
		if hasScheme {
			parts[i] = scheme + "://" + rest
		} else {
			parts[i] = rest
		}
	}
	return strings.Join(parts, ",")
}
