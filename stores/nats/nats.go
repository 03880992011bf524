package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/driver"
)

const driverName = "nats"

// Limits and defaults of [Options].
const (
	// TTLFloor is the smallest lease TTL: limit markers have a precision of
	// one second.
	TTLFloor = 2 * time.Second
	// DefaultMaxValueSize caps stored values: well under the 1 MiB NATS
	// payload ceiling after headers.
	DefaultMaxValueSize = 512 << 10
	// ExpiryLatency bounds how late after its deadline an expired lease's
	// delete reaches watchers: the server's expiry timer and the marker's
	// write (a raft round trip on R3). Measured on embedded servers (R1 and
	// R3, TestLeaseExpiryLatency): at most about 0.35 s after the TTL; the
	// bound leaves room for loaded servers.
	ExpiryLatency = time.Second
	// WatchStallBound bounds how long after a change is written a watch
	// whose consumer has stopped delivering breaks with a Retryable error,
	// on a server that answers (see Store.Watch): a watch is never silent
	// about a change for longer. An idle watch asks the server about its
	// consumer every eighth of it.
	WatchStallBound = 12 * time.Second
	// MinServerVersion is the oldest nats-server the driver accepts.
	MinServerVersion = "2.11.0"
)

// history is how many revisions per key a bucket keeps.
const history = 1

// headerRoom is what the stream's message cap allows beyond MaxValueSize for
// the headers the driver and the server add.
const headerRoom = 4 << 10

// Options configure a store.
type Options struct {
	// Job names the bucket pair: 1–64 characters of [A-Za-z0-9_-]. Every
	// worker of one job uses the same Job. Required.
	Job string
	// TTL is the lease TTL of the ephemeral keyspace, at least [TTLFloor].
	// It is fixed for the life of the job's buckets. Required.
	TTL time.Duration
	// Replicas per bucket: 1, 3 or 5. Default 1 (development); production
	// uses 3 or 5.
	Replicas int
	// Storage of the buckets. The zero value is jetstream.FileStorage, which
	// production needs; memory storage loses everything on restart.
	Storage jetstream.StorageType
	// MaxValueSize caps values in bytes. Default [DefaultMaxValueSize].
	MaxValueSize int
	// Logger receives the driver's few log lines. Default: discard.
	Logger *slog.Logger
}

var jobRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// validate checks opts and fills in defaults; every violation is reported.
func (o *Options) validate() error {
	var errs []error
	if !jobRe.MatchString(o.Job) {
		errs = append(errs, fmt.Errorf("job %q must be 1-64 characters of [A-Za-z0-9_-]", o.Job))
	}
	if o.TTL < TTLFloor {
		errs = append(errs, fmt.Errorf("TTL %v is below the NATS floor of %v (limit markers have one-second precision)", o.TTL, TTLFloor))
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	if o.Replicas != 1 && o.Replicas != 3 && o.Replicas != 5 {
		errs = append(errs, fmt.Errorf("replicas must be 1, 3 or 5, got %d", o.Replicas))
	}
	if o.Storage != jetstream.FileStorage && o.Storage != jetstream.MemoryStorage {
		errs = append(errs, fmt.Errorf("storage must be file or memory, got %v", o.Storage))
	}
	if o.MaxValueSize == 0 {
		o.MaxValueSize = DefaultMaxValueSize
	}
	if o.MaxValueSize < 0 {
		errs = append(errs, fmt.Errorf("max value size must be positive, got %d", o.MaxValueSize))
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("nats: invalid options: %w: %w", err, spate.ErrFatal)
	}
	return nil
}

// Buckets returns the names of the durable and the ephemeral bucket of job.
func Buckets(job string) (durable, ephemeral string) {
	return "spate_coordination_" + job + "_state", "spate_coordination_" + job + "_lease"
}

// Store is a spate store over one job's JetStream KV buckets. It is safe for
// concurrent use. The portable layer ([driver.PortableStore]) does the
// argument checks and the closed state; the driver below it does the rest.
type Store struct {
	*driver.PortableStore
	s *store
}

// store is the NATS [driver.Driver].
type store struct {
	js   jetstream.JetStream
	opts Options
	log  *slog.Logger
	b    [2]*bucket // by Keyspace-1

	ctx    context.Context // cancelled by Close; parents every watch
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// ownedConn is the connection of a store opened by URL, which Close
	// closes.
	ownedConn *natsgo.Conn

	// perms reports the connection's permission violations; scope tells
	// the store's own from other users' of the connection.
	perms *permWatch
	scope permScope
	// unguarded is set once the server refused a watch's check of its
	// consumer (CONSUMER.INFO): watches then run without guard.
	unguarded atomic.Bool
}

var (
	_ spate.Store   = (*Store)(nil)
	_ driver.Driver = (*store)(nil)
)

// bucket is one keyspace's stream.
type bucket struct {
	ks     spate.Keyspace
	name   string // KV bucket name
	stream jetstream.Stream
	pre    string // subject prefix of keys: "$KV.<name>."
	// goneSince is when (Unix ns) requests about the stream began to be
	// answered "stream not found" without a break, or 0 (see onStream).
	goneSince atomic.Int64
}

// New opens the store of opts.Job over nc, creating the job's buckets or
// adopting existing ones (see the package documentation). It checks the
// server's version and JetStream. nc stays the caller's: Close leaves it
// open.
//
// Errors: Fatal for bad options, a closed connection, a failed
// authentication, a server older than 2.11, JetStream disabled, and existing
// buckets with other settings; Retryable for a connection that is not
// (yet) connected, timeouts and a cancelled ctx.
func New(ctx context.Context, nc *natsgo.Conn, opts Options) (_ *Store, err error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if err := driver.ContextError(ctx, driverName, "open"); err != nil {
		return nil, err
	}
	if err := checkConn(nc); err != nil {
		return nil, err
	}
	if err := checkServerVersion(nc.ConnectedServerVersion()); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("nats: open: %w: %w", err, spate.ErrFatal)
	}
	s := &store{js: js, opts: opts, log: opts.Logger,
		perms: watchPermissions(nc), scope: newPermScope(nc, opts.Job)}
	// A refused inbox subscription was reported once, when nats.go made
	// it; every request on the connection would now time out.
	if v, ok := parseViolation(nc.LastError()); ok && v.subscribe && s.scope.owns(v) {
		return nil, fmt.Errorf("nats: open: %w", s.scope.deniedError(v))
	}
	ctx, end := s.guard(ctx, "nats: open", &err)
	defer end()
	if _, err := js.AccountInfo(ctx); err != nil {
		return nil, fmt.Errorf("nats: open: account info: %w", classify(err))
	}
	dname, ename := Buckets(opts.Job)
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		name := dname
		if ks == spate.Ephemeral {
			name = ename
		}
		b, err := s.ensureBucket(ctx, ks, name, dname, ename)
		if err != nil {
			return nil, err
		}
		s.b[ks-1] = b
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return &Store{PortableStore: driver.NewStore(s), s: s}, nil
}

// checkConn refuses a connection that cannot serve: closed is Fatal, a
// failed authentication is Fatal, not connected (yet) is Retryable.
func checkConn(nc *natsgo.Conn) error {
	if nc == nil {
		return fmt.Errorf("nats: open: nil connection: %w", spate.ErrFatal)
	}
	last := nc.LastError()
	if nc.IsClosed() {
		if last != nil {
			if fatal := connectFatal(last); fatal != "" {
				return fmt.Errorf("nats: open: the connection is closed: %s: %w: %w", fatal, last, spate.ErrFatal)
			}
		}
		return fmt.Errorf("nats: open: the connection is closed: %w", spate.ErrFatal)
	}
	if nc.IsConnected() {
		return nil
	}
	if last != nil {
		if fatal := connectFatal(last); fatal != "" {
			return fmt.Errorf("nats: open: %s: %w: %w", fatal, last, spate.ErrFatal)
		}
		return fmt.Errorf("nats: open: not connected (status %v): %w: %w", nc.Status(), last, spate.ErrRetryable)
	}
	return fmt.Errorf("nats: open: not connected (status %v): %w", nc.Status(), spate.ErrRetryable)
}

// streamConfig is the stream behind keyspace ks's bucket: a KV bucket's
// stream, with direct get off so that reads go to the leader.
func (s *store) streamConfig(ks spate.Keyspace, name string) jetstream.StreamConfig {
	cfg := jetstream.StreamConfig{
		Name:              "KV_" + name,
		Description:       fmt.Sprintf("spate coordination, job %s, %s keyspace", s.opts.Job, ks),
		Subjects:          []string{"$KV." + name + ".>"},
		MaxMsgsPerSubject: history,
		MaxBytes:          -1,
		MaxMsgs:           -1,
		MaxConsumers:      -1,
		MaxMsgSize:        int32(s.opts.MaxValueSize + headerRoom),
		Storage:           s.opts.Storage,
		Replicas:          s.opts.Replicas,
		AllowRollup:       true,
		DenyDelete:        true,
		Discard:           jetstream.DiscardNew,
		Duplicates:        2 * time.Minute,
		AllowDirect:       false,
	}
	if ks == spate.Ephemeral {
		cfg.MaxAge = s.opts.TTL
		cfg.Duplicates = min(s.opts.TTL, 2*time.Minute)
		cfg.AllowMsgTTL = true
		cfg.SubjectDeleteMarkerTTL = s.opts.TTL
	}
	return cfg
}

// ensureBucket creates keyspace ks's bucket or adopts an existing one.
func (s *store) ensureBucket(ctx context.Context, ks spate.Keyspace, name, dname, ename string) (*bucket, error) {
	want := s.streamConfig(ks, name)
	st, err := s.js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = s.js.CreateStream(ctx, want)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			// Another worker created it first, with other settings.
			st, err = s.js.Stream(ctx, want.Name)
		} else if err == nil {
			s.log.Info("nats: created bucket", "bucket", name, "keyspace", ks.String(),
				"replicas", want.Replicas, "storage", want.Storage.String(), "max_age", want.MaxAge)
		}
	}
	if err != nil {
		return nil, classifyProvision(name, err)
	}
	if err := checkAdopt(ks, name, st.CachedInfo().Config, want, dname, ename); err != nil {
		return nil, err
	}
	b := &bucket{ks: ks, name: name, stream: st, pre: "$KV." + name + "."}
	if err := s.awaitStream(ctx, b); err != nil {
		return nil, err
	}
	return b, nil
}

// readyProbeKey is the key awaitStream's probe publishes to. Any key would
// do: the probe can never be stored.
const readyProbeKey = "spate-ready-probe"

// readyWait bounds how long New waits for a bucket's stream to answer.
const readyWait = 5 * time.Second

// awaitStream waits until the bucket's stream answers a publish sent
// through this connection's server, so that New returns a store that can
// write. A stream just created (by this store or another) is led by one
// server, and its subject interest reaches the other servers of a cluster
// a little later: until then a publish through them finds no responders,
// and the first write of a freshly opened store would fail Retryable
// (measured on a 3-node R3 cluster: 3 buckets in 30 lacked interest on two
// nodes right after creation, for 1 to 2 ms on an idle machine, longer on
// a loaded one). The probe expects the probe key at the largest sequence,
// which no key can hold, so the stream refuses it with "wrong last
// sequence" and stores nothing: a refusal is the answer it waits for. No
// responders is waited out, for at most readyWait; a stream that stays
// unreachable (no leader, no quorum) fails New Retryable, saying so.
func (s *store) awaitStream(ctx context.Context, b *bucket) error {
	m := &natsgo.Msg{Subject: b.pre + readyProbeKey}
	deadline := time.Now().Add(readyWait)
	for delay := time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		_, err := s.js.PublishMsg(ctx, m, jetstream.WithRetryAttempts(0),
			jetstream.WithExpectLastSequencePerSubject(math.MaxUint64))
		var apiErr *jetstream.APIError
		switch {
		case err == nil:
			// Stored after all: a server that ignores the expectation.
			return fmt.Errorf("nats: open: bucket %s stored a publish that expected a sequence no key can hold: the server does not honour Nats-Expected-Last-Subject-Sequence: %w", b.name, spate.ErrFatal)
		case errors.As(err, &apiErr):
			return nil // the stream's leader answered
		case !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, natsgo.ErrNoResponders):
			return fmt.Errorf("nats: open: bucket %s: probe publish: %w", b.name, classify(err))
		case time.Now().Add(delay).After(deadline):
			return fmt.Errorf("nats: open: bucket %s: its stream found no responders through this server for %v (no stream leader, or the cluster lacks a quorum): %w: %w",
				b.name, readyWait, err, spate.ErrRetryable)
		}
		if !pause(ctx, delay) {
			return fmt.Errorf("nats: open: bucket %s: waiting for its stream to answer: %w", b.name, classify(ctx.Err()))
		}
	}
}

// checkAdopt reports why an existing bucket's stream cannot serve as keyspace
// ks's bucket configured as want, or nil.
func checkAdopt(ks spate.Keyspace, name string, got, want jetstream.StreamConfig, dname, ename string) error {
	fix := fmt.Sprintf("finish the job or delete buckets %s and %s (nats kv del)", dname, ename)
	if got.MaxAge != want.MaxAge {
		what := "lease TTL"
		if ks == spate.Durable {
			what = "durable keyspace, which needs no max age"
		}
		return fmt.Errorf("nats: bucket %s has max age %v but the %s is %v: lease duration cannot change mid-job: %s: %w",
			name, got.MaxAge, what, want.MaxAge, fix, spate.ErrFatal)
	}
	var errs []error
	if got.MaxMsgsPerSubject != want.MaxMsgsPerSubject {
		errs = append(errs, fmt.Errorf("keeps %d revisions per key, spate needs %d", got.MaxMsgsPerSubject, want.MaxMsgsPerSubject))
	}
	if got.Replicas != want.Replicas {
		errs = append(errs, fmt.Errorf("has %d replicas but the options ask for %d (scale the streams with `nats stream edit KV_<bucket> --replicas %d`, or set Replicas to %d)",
			got.Replicas, want.Replicas, want.Replicas, got.Replicas))
	}
	if got.Storage != want.Storage {
		errs = append(errs, fmt.Errorf("uses %v storage but the options ask for %v", got.Storage, want.Storage))
	}
	if got.AllowDirect {
		errs = append(errs, errors.New("allows direct get, so followers answer reads and may return stale values"))
	}
	if ks == spate.Ephemeral && (got.SubjectDeleteMarkerTTL <= 0 || !got.AllowMsgTTL) {
		errs = append(errs, errors.New("has no limit markers, so lease expiry would never reach watchers"))
	}
	if len(got.Subjects) != 1 || got.Subjects[0] != want.Subjects[0] {
		errs = append(errs, fmt.Errorf("has subjects %v, want %v", got.Subjects, want.Subjects))
	}
	if got.MaxMsgSize > 0 && got.MaxMsgSize < want.MaxMsgSize {
		errs = append(errs, fmt.Errorf("caps messages at %d bytes, below the %d the value cap needs", got.MaxMsgSize, want.MaxMsgSize))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("nats: bucket %s was created with other settings: %w: %s: %w", name, err, fix, spate.ErrFatal)
	}
	return nil
}

// Capabilities implements [driver.Driver].
func (s *store) Capabilities() spate.Capabilities {
	return capabilities(s.opts)
}

func capabilities(o Options) spate.Capabilities {
	file := o.Storage == jetstream.FileStorage
	var dur string
	switch {
	case !file:
		dur = fmt.Sprintf("memory storage, R%d: a replica that restarts comes back empty and a restart of all servers loses everything; for tests only", o.Replicas)
	case o.Replicas == 1:
		dur = "file storage, R1: one server; acknowledged writes survive a server restart, but with the default sync_interval (2 min) a host crash or power loss can lose recent acknowledged writes; for development"
	default:
		dur = fmt.Sprintf("file storage, R%d: a write is acknowledged once a quorum of replicas has it; it survives the loss of %d server(s) when every server runs with sync_interval: always (with the default 2 min interval Jepsen lost acknowledged writes to power failures and OS crashes; corrupted data files on a minority of nodes could also lose writes)",
			o.Replicas, (o.Replicas-1)/2)
	}
	return spate.Capabilities{
		Driver:               driverName,
		TTL:                  o.TTL,
		TTLFloor:             TTLFloor,
		ExpiryLatency:        ExpiryLatency,
		MaxValueSize:         o.MaxValueSize,
		LinearizableFailover: file && o.Replicas >= 3,
		Durability:           dur,
		RequiredSettings: []string{
			"nats-server >= " + MinServerVersion + " (limit markers make lease expiry visible to watchers)",
			"JetStream enabled for the account",
			"production: Replicas 3 or 5 with file storage",
			"production: jetstream { sync_interval: always } on every server",
		},
	}
}

// Close ends the store's watches and leaves a connection the caller passed
// to New open (a store opened by URL closes the connection it made). The
// portable layer calls it once.
func (s *store) Close() error {
	s.cancel()
	s.wg.Wait()
	if s.ownedConn != nil {
		s.ownedConn.Close()
	}
	return nil
}

// Headers that mark a message as a delete: the KV operation header of
// explicit deletes and purges, and the reason header of the server's limit
// markers.
const (
	kvOpHeader     = "KV-Operation"
	kvOpDelete     = "DEL"
	kvOpPurge      = "PURGE"
	markerHeader   = "Nats-Marker-Reason"
	createAttempts = 4
)

// isMarker reports whether a message with header h is a delete, purge or
// limit marker rather than a value.
func isMarker(h natsgo.Header) bool {
	if len(h) == 0 {
		return false
	}
	switch h.Get(kvOpHeader) {
	case kvOpDelete, kvOpPurge:
		return true
	}
	return h.Get(markerHeader) != ""
}

// isConflict reports whether err is a definitive revision conflict: wrong
// last sequence (10071), which the stream leader decides against the
// key's stored last sequence.
func isConflict(err error) bool {
	return apiCode(err) == jetstream.JSErrCodeStreamWrongLastSequence
}

// isInFlight reports whether err is the replicated-stream "wrong last
// sequence" (10164): the leader refused the write before proposing it
// because another write of the same key was still being replicated. That
// is not yet an answer: the other write may still fail, and until it is
// applied, reads show the key at the expected revision. Reporting Lost here
// would not be linearizable (a read right after a Lost would see the
// revision the Lost claimed was gone; the failover test caught exactly
// that), so publish sends the write again until the leader decides. This
// is the one in-driver retry of the store contract ([spate.Store] says
// why): the write was never proposed, so resending it cannot write twice.
func isInFlight(err error) bool {
	return apiCode(err) == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

func apiCode(err error) jetstream.ErrorCode {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return 0
	}
	return apiErr.ErrorCode
}

// inFlightWait bounds how long publish retries a write refused because
// another write of the key was in flight; a raft round trip normally
// settles it in milliseconds.
const inFlightWait = 2 * time.Second

// publish writes one message for key, guarded by the expected last
// sequence of the key's subject when expected is not nil. A write refused
// with 10164 (another write of the key in flight; nothing was written) is
// sent again until the leader gives a definitive answer, for at most
// inFlightWait: see isInFlight. Every other error is returned at once.
func (s *store) publish(ctx context.Context, b *bucket, key string, value []byte, hdr natsgo.Header, expected *uint64) (uint64, error) {
	// nats.go's PublishMsg would resend, twice and 250 ms apart, a publish
	// that found no responders (the stream's leader moving, say). Nothing
	// was written then, and the coordinator retries after a re-read, so
	// the driver makes its one attempt and reports it Retryable.
	opts := []jetstream.PublishOpt{jetstream.WithRetryAttempts(0)}
	if expected != nil {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(*expected))
	}
	m := &natsgo.Msg{Subject: b.pre + key, Data: value, Header: hdr}
	deadline := time.Now().Add(inFlightWait)
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		ack, err := s.js.PublishMsg(ctx, m, opts...)
		if err == nil {
			return ack.Sequence, nil
		}
		if !isInFlight(err) {
			return 0, err
		}
		if time.Now().Add(delay).After(deadline) {
			return 0, fmt.Errorf("another write of the key stayed in flight for %v: %w", inFlightWait, err)
		}
		if !pause(ctx, delay) {
			return 0, fmt.Errorf("%w (another write of the key was in flight: %w)", ctx.Err(), err)
		}
	}
}

// goneWait is how long the server must keep saying that an opened
// bucket's stream does not exist before the driver believes it.
const goneWait = 5 * time.Second

// onStream runs op, a JetStream API request about b's stream, and sends it
// again while the answer is "stream not found", until ctx ends (then the
// error is Retryable). New has seen the stream, so that answer is taken as
// final only when it persists: once every request about the bucket has
// had it for goneWait, across calls (an op timeout may be shorter than
// goneWait; a request cut by its call's deadline got no answer and does
// not restart the wait), the error is Fatal at once. A CI run on a loaded 3-node R3 cluster got it for a stream
// the test had just written to, and failed a key watch's snapshot read.
// The cause was not caught. nats-server answers so from a meta leader
// that holds no assignment for the stream, as a new meta leader would
// before it has applied the stream's creation. When the answer persists
// the bucket was deleted under the job, and the error, still matching
// jetstream.ErrStreamNotFound, is classified Fatal.
func onStream[T any](ctx context.Context, b *bucket, op func() (T, error)) (T, error) {
	for delay := 5 * time.Millisecond; ; delay = min(2*delay, 250*time.Millisecond) {
		v, err := op()
		if !errors.Is(err, jetstream.ErrStreamNotFound) {
			// A request cut by ctx's end got no answer, which says nothing
			// about the stream: the wait goes on. Any answer ends it.
			if (err == nil || ctx.Err() == nil) && b.goneSince.Load() != 0 {
				b.goneSince.Store(0)
			}
			return v, err
		}
		now := time.Now().UnixNano()
		b.goneSince.CompareAndSwap(0, now)
		if since := b.goneSince.Load(); since != 0 && time.Duration(now-since) >= goneWait {
			return v, fmt.Errorf("bucket %s: the server has said for %v that its stream does not exist: it was deleted under the job: %w",
				b.name, time.Duration(now-since).Round(time.Millisecond), err)
		}
		if !pause(ctx, delay) {
			// Not the server's final word: Retryable, as ctx's end is.
			return v, fmt.Errorf("%w (bucket %s: waiting out a stream-not-found answer: %v)", ctx.Err(), b.name, err)
		}
	}
}

// pause waits d, or until ctx ends: it reports whether the wait ran out.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Create implements [driver.Driver]. A deleted or expired key's subject
// holds a marker; Create then re-reads it and publishes at the marker's
// sequence, so Lost is only returned after a read saw a live value. This is
// one compare-and-set found by a read, not a retry of a failed call: the
// loop goes round again only when the marker itself moved between the read
// and the publish (an unconditional delete of the absent key, or the marker
// aging out), which must not be reported Lost because no live value was
// seen. It gives up Retryable after createAttempts rounds.
func (s *store) Create(ctx context.Context, ks spate.Keyspace, key string, value []byte) (_ spate.Outcome, err error) {
	b := s.b[ks-1]
	ctx, end := s.guard(ctx, "", &err)
	defer end()
	var expected uint64
	for range createAttempts {
		rev, err := s.publish(ctx, b, key, value, nil, &expected)
		if err == nil {
			return spate.Won(rev), nil
		}
		if !isConflict(err) {
			return spate.Outcome{}, classify(err)
		}
		r, err := b.read(ctx, key)
		switch {
		case err != nil:
			return spate.Outcome{}, fmt.Errorf("read: %w", err)
		case r.live:
			return spate.Outcome{}, nil
		default:
			expected = r.rev // the marker's, or 0: it aged out meanwhile
		}
	}
	return spate.Outcome{}, fmt.Errorf("the key's delete marker changed under %d attempts: %w", createAttempts, spate.ErrRetryable)
}

// Update implements [driver.Driver]. The portable layer never passes
// expected 0, which would mean "absent" to the server.
func (s *store) Update(ctx context.Context, ks spate.Keyspace, key string, value []byte, expected uint64) (_ spate.Outcome, err error) {
	b := s.b[ks-1]
	ctx, end := s.guard(ctx, "", &err)
	defer end()
	rev, err := s.publish(ctx, b, key, value, nil, &expected)
	if err == nil {
		return spate.Won(rev), nil
	}
	if isConflict(err) {
		return spate.Outcome{}, nil
	}
	return spate.Outcome{}, classify(err)
}

// Get implements [driver.Driver].
func (s *store) Get(ctx context.Context, ks spate.Keyspace, key string) (_ spate.Entry, _ bool, err error) {
	b := s.b[ks-1]
	ctx, end := s.guard(ctx, "", &err)
	defer end()
	return s.get(ctx, b, key)
}

func (s *store) get(ctx context.Context, b *bucket, key string) (spate.Entry, bool, error) {
	r, err := b.read(ctx, key)
	return r.entry, r.live, err
}

// Delete implements [driver.Driver]: it publishes a delete marker, guarded by
// the expected last sequence when expected is not AnyRevision, and returns
// the marker's sequence.
func (s *store) Delete(ctx context.Context, ks spate.Keyspace, key string, expected uint64) (_ spate.Outcome, err error) {
	b := s.b[ks-1]
	ctx, end := s.guard(ctx, "", &err)
	defer end()
	hdr := natsgo.Header{}
	hdr.Set(kvOpHeader, kvOpDelete)
	var guard *uint64
	if expected != spate.AnyRevision {
		guard = &expected
	}
	rev, err := s.publish(ctx, b, key, nil, hdr, guard)
	if err == nil {
		return spate.Won(rev), nil
	}
	if isConflict(err) {
		return spate.Outcome{}, nil
	}
	return spate.Outcome{}, classify(err)
}

// List implements [driver.Driver]: the key set from the stream's subject
// index (one request), then one get per key, up to listFanout at a time:
// 1 + N round trips. Keys whose subject holds a delete or limit marker are
// dropped by their get.
func (s *store) List(ctx context.Context, ks spate.Keyspace, prefix string) (_ []spate.Entry, err error) {
	b := s.b[ks-1]
	ctx, end := s.guard(ctx, "", &err)
	defer end()
	keys, err := b.keySet(ctx, prefix)
	if err != nil {
		return nil, classify(err)
	}
	reads, err := b.readAll(ctx, keys)
	if err != nil {
		return nil, err
	}
	out := make([]spate.Entry, 0, len(reads))
	for _, r := range reads {
		if r.live {
			out = append(out, r.entry)
		}
	}
	return out, nil
}

// classify adds its class to a backend error (the portable layer, or the
// caller outside the six primitives, names the driver, the operation and
// the key).
func classify(err error) error {
	var class error = spate.ErrRetryable
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, natsgo.ErrConnectionClosed):
		return fmt.Errorf("the connection was closed by its owner or ran out of reconnect attempts: %w: %w", err, spate.ErrFatal)
	case connectFatal(err) != "",
		errors.Is(err, natsgo.ErrPermissionViolation),
		errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount),
		errors.Is(err, jetstream.ErrStreamNotFound):
		class = spate.ErrFatal
	case errors.Is(err, natsgo.ErrMaxPayload), errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum):
		return fmt.Errorf("%w: %w: %w", err, spate.ErrValueTooLarge, spate.ErrFatal)
	case errors.As(err, &apiErr) && apiErr.Code == 403:
		class = spate.ErrFatal
	}
	return fmt.Errorf("%w: %w", err, class)
}

// classifyOp is classify for calls outside the six primitives: it names the
// driver, what was done and to what.
func classifyOp(op, what string, err error) error {
	return fmt.Errorf("nats: %s %q: %w", op, what, classify(err))
}

// classifyProvision classifies a failure to create or read a bucket: the
// server refusing the configuration is Fatal, anything else Retryable.
func classifyProvision(name string, err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case 10074, // replicas > 1 not supported in non-clustered mode
			10052, // invalid stream config
			10023, // insufficient resources
			10047, // storage resources exceeded
			10028, // memory resources exceeded
			10027: // maximum streams limit
			return fmt.Errorf("nats: bucket %s: the server refused the configuration: %w: %w", name, err, spate.ErrFatal)
		}
	}
	return fmt.Errorf("nats: bucket %s: %w", name, classify(err))
}
