package storeurl

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spate-go/spate"
)

// DefaultDialTimeout bounds one dial of a client when
// [Options.DialTimeout] is zero.
const DefaultDialTimeout = 5 * time.Second

// Options reach a deployment: credentials, TLS and timeouts that are not
// (or should not be) in the URL. Each takes precedence over what the URL
// says.
type Options struct {
	// Username overrides the URL's user name.
	Username string
	// Password overrides the password_file parameter and the URL's
	// password, when it resolves to a value.
	Password Secret
	// Token overrides the token_file parameter, when it resolves to a
	// value. Only NATS takes a token; the other drivers ignore it.
	Token Secret
	// TLS is the client TLS configuration; the ca_file, cert_file and
	// key_file parameters are applied to a copy of it. Setting it turns TLS
	// on for etcd and NATS; Redis takes TLS only with rediss://.
	TLS *tls.Config
	// Params are more URL parameters, as if they were in the URL's query
	// (the command spate passes --creds as creds=FILE). A parameter given
	// both here and in the URL is an error.
	Params url.Values
	// DialTimeout bounds one dial of a client. Default
	// [DefaultDialTimeout].
	DialTimeout time.Duration
	// Logger receives the drivers' logs. nil discards them.
	Logger *slog.Logger
}

// Deployment is the store deployment a URL names: it opens stores over
// jobs and manages the jobs' namespaces. A Deployment dials nothing until
// a method needs the servers; each method makes one attempt, bounded by
// ctx and the dial timeout, with errors classified Retryable or Fatal as
// the drivers' own constructors classify them. It is safe for concurrent
// use.
type Deployment interface {
	// Info describes the deployment. It never blocks.
	Info() Info
	// Open opens a store over job's keys with ephemeral TTL ttl (see the
	// driver's own New for the checks it runs). Every store has its own
	// client, as separate processes would; closing the store closes it.
	Open(ctx context.Context, job string, ttl time.Duration) (spate.Store, error)
	// Jobs lists the jobs the deployment holds keys of, sorted.
	Jobs(ctx context.Context) ([]string, error)
	// JobExists reports whether the deployment holds keys of job.
	JobExists(ctx context.Context, job string) (bool, error)
	// DeleteJob deletes every key of job, in both keyspaces. Workers still
	// running the job lose their plan, leases and progress: check for them
	// first (spate.LiveWorkers). Deleting an absent job succeeds.
	DeleteJob(ctx context.Context, job string) error
	// RecordedTTL is the ephemeral TTL job was first opened with, for a
	// driver that records it and refuses another (Redis, NATS); ok is
	// false when the driver records none or the job does not exist.
	RecordedTTL(ctx context.Context, job string) (ttl time.Duration, ok bool, err error)
	// Close releases what the deployment holds (an in-process deployment's
	// data included); stores opened from it stay usable unless the driver
	// says otherwise. Idempotent.
	Close() error
}

// Info describes a deployment without reaching it.
type Info struct {
	// Driver names the driver: "mem", "etcd", "redis", "nats".
	Driver string
	// Description says where the deployment is, for people: servers and
	// settings, never a credential ("etcd at http://10.0.0.1:2379").
	Description string
	// TLS reports whether clients reach the servers over TLS.
	TLS bool
	// TTLResolution is the granularity of ephemeral TTLs (etcd: whole
	// seconds); 0 when any duration works.
	TTLResolution time.Duration
	// MinTTL is the smallest TTL worth asking for: the driver's floor, or
	// for etcd the servers' floor under etcd's default timing (the store's
	// startup check learns the real one).
	MinTTL time.Duration
	// InProcess reports a deployment that lives inside this process
	// (mem://): no other process can reach it.
	InProcess bool
}

// Opener opens the deployment of a parsed URL. Drivers implement it and
// register it for their schemes.
type Opener interface {
	OpenDeployment(ctx context.Context, cfg *Config) (Deployment, error)
}

// OpenerFunc adapts a function to [Opener].
type OpenerFunc func(ctx context.Context, cfg *Config) (Deployment, error)

// OpenDeployment calls f.
func (f OpenerFunc) OpenDeployment(ctx context.Context, cfg *Config) (Deployment, error) {
	return f(ctx, cfg)
}

// Mux maps URL schemes to openers. The zero value is an empty mux ready to
// use; [DefaultMux] is the one drivers register with.
type Mux struct {
	mu      sync.RWMutex
	openers map[string]Opener
}

var schemeSyntax = regexp.MustCompile(`^[a-z][a-z0-9+.-]*$`)

// Register makes o open URLs of scheme (lower case). It panics on a
// malformed scheme, a nil opener or a scheme registered twice: these are
// programming errors of a driver package.
func (m *Mux) Register(scheme string, o Opener) {
	if !schemeSyntax.MatchString(scheme) {
		panic(fmt.Sprintf("storeurl: Register: scheme %q is not a lower-case URL scheme", scheme))
	}
	if o == nil {
		panic(fmt.Sprintf("storeurl: Register: nil opener for scheme %q", scheme))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.openers == nil {
		m.openers = map[string]Opener{}
	}
	if _, dup := m.openers[scheme]; dup {
		panic(fmt.Sprintf("storeurl: Register: scheme %q registered twice", scheme))
	}
	m.openers[scheme] = o
}

// Schemes lists the registered schemes, sorted.
func (m *Mux) Schemes() []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]string, 0, len(m.openers))
	for s := range m.openers {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// ValidScheme reports whether scheme is registered.
func (m *Mux) ValidScheme(scheme string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	_, ok := m.openers[strings.ToLower(scheme)]
	return ok
}

// Open parses rawURL, resolves its secrets and TLS files, and opens the
// deployment it names. It dials nothing: a URL is checked without reaching
// the servers. A malformed URL, an unknown scheme or parameter, and an
// unreadable secret or TLS file are Fatal errors that show the URL
// redacted ([Redact]).
func (m *Mux) Open(ctx context.Context, rawURL string, opts Options) (Deployment, error) {
	// An unknown scheme is the first thing to say: the rest of the URL
	// may be another kind of URL altogether.
	if scheme, _, ok := strings.Cut(strings.TrimSpace(rawURL), "://"); ok && schemeSyntax.MatchString(strings.ToLower(scheme)) {
		if !m.ValidScheme(scheme) {
			return nil, m.unknownScheme(&Config{redacted: Redact(rawURL)}, strings.ToLower(scheme))
		}
	}
	cfg, err := parse(rawURL)
	if err != nil {
		return nil, err
	}
	m.mu.RLock()
	o := m.openers[cfg.Scheme]
	m.mu.RUnlock()
	if o == nil {
		return nil, m.unknownScheme(cfg, cfg.Scheme)
	}
	if err := cfg.resolve(opts); err != nil {
		return nil, err
	}
	d, err := o.OpenDeployment(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &checked{d: d}, nil
}

func (m *Mux) unknownScheme(cfg *Config, scheme string) error {
	schemes := m.Schemes()
	if len(schemes) == 0 {
		return cfg.errorf("unknown scheme %q: no store driver is registered (import one, e.g. _ \"github.com/spate-go/spate/stores/etcd\")", scheme)
	}
	return cfg.errorf("unknown scheme %q (registered: %s)", scheme, strings.Join(schemes, ", "))
}

// OpenStore opens the deployment rawURL names and a store over job on it,
// with ephemeral TTL ttl: one attempt (a Retryable error may be retried).
// Closing the store closes the deployment.
func (m *Mux) OpenStore(ctx context.Context, rawURL, job string, ttl time.Duration, opts Options) (spate.Store, error) {
	d, err := m.Open(ctx, rawURL, opts)
	if err != nil {
		return nil, err
	}
	st, err := d.Open(ctx, job, ttl)
	if err != nil {
		_ = d.Close()
		return nil, err
	}
	o := &ownedStore{Store: st, d: d}
	if r, ok := spate.ReleaserOf(st); ok {
		return &ownedReleaser{ownedStore: o, r: r}, nil
	}
	return o, nil
}

var defaultMux = new(Mux)

// DefaultMux is the mux the drivers of this module register with, and the
// one the package-level functions use.
func DefaultMux() *Mux { return defaultMux }

// Register registers o for scheme on [DefaultMux]; see [Mux.Register].
func Register(scheme string, o Opener) { defaultMux.Register(scheme, o) }

// Schemes lists the schemes registered on [DefaultMux].
func Schemes() []string { return defaultMux.Schemes() }

// Open opens a deployment through [DefaultMux]; see [Mux.Open].
func Open(ctx context.Context, rawURL string, opts Options) (Deployment, error) {
	return defaultMux.Open(ctx, rawURL, opts)
}

// OpenStore opens a store through [DefaultMux]; see [Mux.OpenStore].
func OpenStore(ctx context.Context, rawURL, job string, ttl time.Duration, opts Options) (spate.Store, error) {
	return defaultMux.OpenStore(ctx, rawURL, job, ttl, opts)
}

// ownedStore closes its deployment after itself.
type ownedStore struct {
	spate.Store
	d Deployment
}

// Capabilities reports the store's, with WatchKeys and Sessions only if
// it has the capability (the wrapper passes them on).
func (o *ownedStore) Capabilities() spate.Capabilities {
	c := o.Store.Capabilities()
	_, c.WatchKeys = spate.KeyWatcherOf(o.Store)
	_, c.Sessions = spate.SessionerOf(o.Store)
	return c
}

// NewSession implements [spate.Sessioner] over the store's.
func (o *ownedStore) NewSession(ctx context.Context) (spate.Session, error) {
	sr, ok := spate.SessionerOf(o.Store)
	if !ok {
		return nil, fmt.Errorf("the store has no Sessioner capability: %w", spate.ErrFatal)
	}
	return sr.NewSession(ctx)
}

// WatchKeys implements [spate.KeyWatcher] over the store's.
func (o *ownedStore) WatchKeys(ctx context.Context, ks spate.Keyspace, keys []string) (<-chan spate.WatchEvent, error) {
	kw, ok := spate.KeyWatcherOf(o.Store)
	if !ok {
		return nil, fmt.Errorf("the store has no KeyWatcher capability: %w", spate.ErrFatal)
	}
	return kw.WatchKeys(ctx, ks, keys)
}

func (o *ownedStore) Close() error {
	err := o.Store.Close()
	_ = o.d.Close()
	return err
}

// ownedReleaser is an ownedStore over a store with the [spate.Releaser]
// capability, which it passes on.
type ownedReleaser struct {
	*ownedStore
	r spate.Releaser
}

func (o *ownedReleaser) UpdateAndDelete(ctx context.Context, durableKey string, value []byte, expected uint64,
	ephemeralKey string, leaseExpected uint64) (spate.Outcome, spate.Outcome, error) {
	return o.r.UpdateAndDelete(ctx, durableKey, value, expected, ephemeralKey, leaseExpected)
}

var jobSyntax = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidateJob reports whether job is a valid job name: 1–64 characters of
// [A-Za-z0-9_-], which every driver can map to its namespace. The error
// matches spate.ErrFatal.
func ValidateJob(job string) error {
	if !jobSyntax.MatchString(job) {
		return &Error{msg: fmt.Sprintf("job name %q must be 1-64 characters of [A-Za-z0-9_-]", job)}
	}
	return nil
}

// checked validates the arguments of every Deployment call before the
// driver sees them.
type checked struct{ d Deployment }

func (c *checked) Info() Info { return c.d.Info() }

func (c *checked) Open(ctx context.Context, job string, ttl time.Duration) (spate.Store, error) {
	if err := ValidateJob(job); err != nil {
		return nil, err
	}
	if ttl <= 0 {
		return nil, &Error{msg: fmt.Sprintf("TTL must be positive, got %v", ttl)}
	}
	return c.d.Open(ctx, job, ttl)
}

func (c *checked) Jobs(ctx context.Context) ([]string, error) {
	jobs, err := c.d.Jobs(ctx)
	slices.Sort(jobs)
	return jobs, err
}

func (c *checked) JobExists(ctx context.Context, job string) (bool, error) {
	if err := ValidateJob(job); err != nil {
		return false, err
	}
	return c.d.JobExists(ctx, job)
}

func (c *checked) DeleteJob(ctx context.Context, job string) error {
	if err := ValidateJob(job); err != nil {
		return err
	}
	return c.d.DeleteJob(ctx, job)
}

func (c *checked) RecordedTTL(ctx context.Context, job string) (time.Duration, bool, error) {
	if err := ValidateJob(job); err != nil {
		return 0, false, err
	}
	return c.d.RecordedTTL(ctx, job)
}

func (c *checked) Close() error { return c.d.Close() }

// Error is a bad URL, option or argument. It matches spate.ErrFatal, and
// its message never holds a secret.
type Error struct {
	msg string
	err error
}

func (e *Error) Error() string { return e.msg }

// Unwrap returns the cause, if any.
func (e *Error) Unwrap() error { return e.err }

// Is matches spate.ErrFatal.
func (e *Error) Is(target error) bool { return target == spate.ErrFatal }
