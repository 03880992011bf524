package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/driver"
)

// Defaults and limits of [Options].
const (
	// DefaultMaxValueSize is 1 MiB: etcd's default --max-request-bytes is
	// 1.5 MiB, and a write request carries the key twice (compare and put)
	// plus framing, so 1 MiB leaves half a MiB of headroom.
	DefaultMaxValueSize = 1 << 20
	// DefaultStartupTimeout bounds New's startup check.
	DefaultStartupTimeout = 10 * time.Second
	// DefaultWatchBuffer is how many live events a watcher may fall behind.
	DefaultWatchBuffer = 4096
	// DefaultRevokeTimeout bounds each best-effort lease revocation.
	DefaultRevokeTimeout = 5 * time.Second
	// PrefixMaxLen bounds Options.Prefix.
	PrefixMaxLen = 512

	// requestOverhead is what a write request adds to the value: the full
	// key twice (at most PrefixMaxLen + keyspace tag + KeyMaxLen each) and
	// protobuf framing.
	requestOverhead = 4 << 10
	// listPage is how many keys one range request of a listing fetches.
	listPage = 1000
	// reapQueue is how many superseded leases may wait for revocation.
	reapQueue = 1024
)

// Keyspace tags under Options.Prefix.
const (
	durableTag   = "durable/"
	ephemeralTag = "ephemeral/"
)

// Options configure a store. The zero value of every optional field means
// its default.
type Options struct {
	// Prefix namespaces every key the store reads and writes, one per job
	// (and tenant): "/spate/<job>/". It is 1–512 bytes of [A-Za-z0-9_.:/-]
	// ending with '/'. Two stores whose prefixes do not nest never see each
	// other's keys; never give a job a prefix that starts with another
	// job's prefix. Required.
	Prefix string
	// TTL of the ephemeral keyspace: a whole number of seconds (etcd leases
	// have one-second resolution), at least the server's minimum lease TTL
	// (1.5 election timeouts rounded up: 2 s with etcd's default timing).
	// New checks it against the server. Required.
	TTL time.Duration
	// MaxValueSize caps values in bytes. Default [DefaultMaxValueSize]; it
	// must stay below the server's --max-request-bytes minus 4 KiB.
	MaxValueSize int
	// StartupTimeout bounds New's startup check. Default
	// [DefaultStartupTimeout].
	StartupTimeout time.Duration
	// WatchBuffer is how many live events a watcher may fall behind before
	// its stream is cut with a Retryable error. Default [DefaultWatchBuffer].
	WatchBuffer int
	// Logger receives the driver's few logs (lease revocations that failed,
	// keys under the prefix that are not valid store keys). nil discards.
	Logger *slog.Logger
}

func (o *Options) validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if err := validatePrefix(o.Prefix); err != nil {
		errs = append(errs, err)
	}
	switch {
	case o.TTL <= 0:
		bad("TTL must be positive, got %v", o.TTL)
	case o.TTL%time.Second != 0:
		bad("TTL must be a whole number of seconds (etcd leases have one-second resolution), got %v", o.TTL)
	}
	if o.MaxValueSize < 0 {
		bad("MaxValueSize must not be negative, got %d", o.MaxValueSize)
	}
	if o.StartupTimeout < 0 {
		bad("StartupTimeout must not be negative, got %v", o.StartupTimeout)
	}
	if o.WatchBuffer < 0 {
		bad("WatchBuffer must not be negative, got %d", o.WatchBuffer)
	}
	if len(errs) > 0 {
		return fmt.Errorf("etcd: invalid options: %w: %w", errors.Join(errs...), spate.ErrFatal)
	}
	if o.MaxValueSize == 0 {
		o.MaxValueSize = DefaultMaxValueSize
	}
	if o.StartupTimeout == 0 {
		o.StartupTimeout = DefaultStartupTimeout
	}
	if o.WatchBuffer == 0 {
		o.WatchBuffer = DefaultWatchBuffer
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

func validatePrefix(p string) error {
	switch {
	case p == "":
		return errors.New(`Prefix is required (one per job, e.g. "/spate/<job>/")`)
	case len(p) > PrefixMaxLen:
		return fmt.Errorf("Prefix is longer than %d bytes", PrefixMaxLen)
	case !strings.HasSuffix(p, "/"):
		return fmt.Errorf("Prefix %q must end with '/' so that no job's prefix is a plain string prefix of another's", p)
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		ok := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			c == '_' || c == '.' || c == '-' || c == '/' || c == ':'
		if !ok {
			return fmt.Errorf("Prefix %q holds %q outside [A-Za-z0-9_.:/-]", p, c)
		}
	}
	return nil
}

// Store is a [spate.Store] over an etcd v3 cluster. It is safe for
// concurrent use. The portable layer ([driver.PortableStore]) does the
// argument checks and the closed state; the driver below it does the rest.
type Store struct {
	*driver.PortableStore
	s *store
}

// store is the etcd [driver.Driver].
type store struct {
	cli      *clientv3.Client
	prefix   string
	ttl      time.Duration
	ttlSec   int64
	floor    time.Duration
	maxValue int
	opts     Options
	log      *slog.Logger

	// ctx ends with Close: it stops watches and the lease reaper.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	reap   chan clientv3.LeaseID
	// reapHook, set only by tests, runs after each background revocation.
	reapHook func(clientv3.LeaseID)
	// lagHook, set only by tests, runs when a watcher is cut for lagging.
	lagHook func()

	// ownsClient: the store was opened by URL and closes its client.
	ownsClient bool
}

var (
	_ spate.Store     = (*Store)(nil)
	_ driver.Driver   = (*store)(nil)
	_ spate.Releaser  = (*store)(nil)
	_ spate.Sessioner = (*Store)(nil)
)

// New opens a store over client, which the caller keeps owning: Close never
// closes it. New first runs a startup check bounded by
// Options.StartupTimeout (and ctx): a linearizable read and a no-op
// conditional write over the prefix (proving quorum, credentials and
// readwrite permission) and a one-second lease grant (learning the server's
// minimum lease TTL, which TTL must not undercut).
//
// A wrong password, missing permission, rejected certificate or TTL below
// the server's floor is a Fatal error that says what to fix. A cluster that
// cannot be reached (no endpoint accepts connections, or no quorum) is a
// Retryable error: the caller may retry New.
func New(ctx context.Context, client *clientv3.Client, opts Options) (*Store, error) {
	if client == nil {
		return nil, fmt.Errorf("etcd: New: client is nil: %w", spate.ErrFatal)
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	s := &store{
		cli:      client,
		prefix:   opts.Prefix,
		ttl:      opts.TTL,
		ttlSec:   int64(opts.TTL / time.Second),
		maxValue: opts.MaxValueSize,
		opts:     opts,
		log:      opts.Logger,
		ctx:      sctx,
		cancel:   cancel,
		reap:     make(chan clientv3.LeaseID, reapQueue),
	}
	if err := s.startupCheck(ctx); err != nil {
		cancel()
		return nil, err
	}
	s.wg.Go(s.reaper)
	return &Store{PortableStore: driver.NewStore(s), s: s}, nil
}

// Capabilities implements [driver.Driver].
func (s *store) Capabilities() spate.Capabilities {
	return spate.Capabilities{
		Driver:               "etcd",
		TTL:                  s.ttl,
		TTLFloor:             s.floor,
		ExpiryLatency:        ExpiryLatency,
		MaxValueSize:         s.maxValue,
		LinearizableFailover: true,
		Durability: "a write is acknowledged once a majority of members has it in its fsynced raft log: it survives the crash or loss of " +
			"a minority of members (1 of 3, 2 of 5); a single-member cluster survives a process crash, not the loss of its disk. " +
			"Ephemeral keys are stored the same way until their lease expires.",
		RequiredSettings: []string{
			"3 or 5 members for fault tolerance (1 member has none)",
			fmt.Sprintf("--max-request-bytes at least MaxValueSize + 4 KiB (%d bytes here)", s.maxValue+requestOverhead),
			"--max-txn-ops at least 2 (default 128)",
			"with auth enabled: the client's user needs readwrite on the prefix range " + s.prefix,
			"compaction must keep history for longer than a watch takes to re-establish (a few seconds is plenty); a watch that falls behind compaction is cut Retryable",
		},
	}
}

// ExpiryLatency is how late after its deadline an expired ephemeral key's
// delete reaches watchers: etcd's leader looks for expired leases every
// 500 ms, then commits the revocation through raft. Measured on an embedded
// single-member server (see the package tests). After a leader change the
// new leader restarts every lease's countdown (plus one election timeout),
// so keys then outlive their deadline by up to one TTL; that is not counted
// here.
const ExpiryLatency = time.Second

// Close ends every watch and the lease reaper. It never closes a client
// the caller passed to New (a store opened by URL closes the client it
// made). Leases the store granted and did not revoke expire on their own
// within one TTL. The portable layer calls it once.
func (s *store) Close() error {
	s.cancel()
	s.wg.Wait()
	if s.ownsClient {
		_ = s.cli.Close()
	}
	return nil
}

// key maps a store key (or prefix) to its etcd key.
func (s *store) key(ks spate.Keyspace, k string) string {
	if ks == spate.Durable {
		return s.prefix + durableTag + k
	}
	return s.prefix + ephemeralTag + k
}

// live fails a call when the client's owner has closed the client: nothing
// will ever succeed on it.
func (s *store) live() error {
	if err := s.cli.Ctx().Err(); err != nil {
		return fmt.Errorf("the etcd client was closed by its owner while the store is open: %w: %w", err, spate.ErrFatal)
	}
	return nil
}

// revision converts an expected revision to etcd's int64; ok is false for
// values no live key can have.
func revision(expected uint64) (int64, bool) {
	if expected == 0 || expected > math.MaxInt64 {
		return 0, false
	}
	return int64(expected), true
}

// Create implements [driver.Driver]: a transaction that puts the key only if
// its CreateRevision is 0 (absent). On the ephemeral keyspace the put carries
// a lease granted just before, so the key expires one TTL later.
func (s *store) Create(ctx context.Context, ks spate.Keyspace, key string, value []byte) (spate.Outcome, error) {
	if err := s.live(); err != nil {
		return spate.Outcome{}, err
	}
	full := s.key(ks, key)
	cond := clientv3.Compare(clientv3.CreateRevision(full), "=", 0)
	return s.put(ctx, ks, full, value, cond)
}

// Update implements [driver.Driver]: a transaction that puts the key only if
// its ModRevision equals expected. On the ephemeral keyspace the put moves
// the key onto a fresh lease, which re-arms its TTL.
func (s *store) Update(ctx context.Context, ks spate.Keyspace, key string, value []byte, expected uint64) (spate.Outcome, error) {
	if err := s.live(); err != nil {
		return spate.Outcome{}, err
	}
	rev, ok := revision(expected)
	if !ok {
		return spate.Outcome{}, nil // no live key is at this revision
	}
	full := s.key(ks, key)
	cond := clientv3.Compare(clientv3.ModRevision(full), "=", rev)
	return s.put(ctx, ks, full, value, cond)
}

func (s *store) put(ctx context.Context, ks spate.Keyspace, full string, value []byte, cond clientv3.Cmp) (spate.Outcome, error) {
	var opts []clientv3.OpOption
	var lease clientv3.LeaseID
	if ks == spate.Ephemeral {
		g, err := s.cli.Grant(ctx, s.ttlSec)
		if err != nil {
			return spate.Outcome{}, fmt.Errorf("grant a lease: %w", s.classify(ctx, err))
		}
		lease = g.ID
		opts = append(opts, clientv3.WithLease(lease), clientv3.WithPrevKV())
	}
	resp, err := s.cli.Txn(ctx).If(cond).Then(clientv3.OpPut(full, string(value), opts...)).Commit()
	if err != nil {
		// The write may have landed on this lease, so the lease stays: if
		// the write did not land it expires, unused, within one TTL.
		return spate.Outcome{}, s.classify(ctx, err)
	}
	if !resp.Succeeded {
		if lease != clientv3.NoLease {
			s.revokeLost(lease)
		}
		return spate.Outcome{}, nil
	}
	if lease != clientv3.NoLease {
		if pr := resp.Responses[0].GetResponsePut(); pr != nil && pr.PrevKv != nil {
			s.supersede(clientv3.LeaseID(pr.PrevKv.Lease))
		}
	}
	return spate.Won(uint64(resp.Header.Revision)), nil
}

// Get implements [driver.Driver] with a linearizable read.
func (s *store) Get(ctx context.Context, ks spate.Keyspace, key string) (spate.Entry, bool, error) {
	if err := s.live(); err != nil {
		return spate.Entry{}, false, err
	}
	resp, err := s.cli.Get(ctx, s.key(ks, key))
	if err != nil {
		return spate.Entry{}, false, s.classify(ctx, err)
	}
	if len(resp.Kvs) == 0 {
		return spate.Entry{}, false, nil
	}
	kv := resp.Kvs[0]
	return spate.Entry{Key: key, Value: value(kv), Revision: uint64(kv.ModRevision)}, true, nil
}

// Delete implements [driver.Driver]. A guarded delete is a transaction on
// ModRevision; an unguarded one always wins. The outcome's revision is the
// delete's own revision (0 when an unguarded delete found nothing).
func (s *store) Delete(ctx context.Context, ks spate.Keyspace, key string, expected uint64) (spate.Outcome, error) {
	if err := s.live(); err != nil {
		return spate.Outcome{}, err
	}
	full := s.key(ks, key)
	var opts []clientv3.OpOption
	if ks == spate.Ephemeral {
		opts = append(opts, clientv3.WithPrevKV()) // to revoke the key's lease
	}
	if expected == spate.AnyRevision {
		resp, err := s.cli.Delete(ctx, full, opts...)
		if err != nil {
			return spate.Outcome{}, s.classify(ctx, err)
		}
		if resp.Deleted == 0 {
			return spate.Won(0), nil
		}
		for _, kv := range resp.PrevKvs {
			s.supersede(clientv3.LeaseID(kv.Lease))
		}
		return spate.Won(uint64(resp.Header.Revision)), nil
	}
	rev, ok := revision(expected)
	if !ok {
		return spate.Outcome{}, nil
	}
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(full), "=", rev)).
		Then(clientv3.OpDelete(full, opts...)).
		Commit()
	if err != nil {
		return spate.Outcome{}, s.classify(ctx, err)
	}
	if !resp.Succeeded {
		return spate.Outcome{}, nil
	}
	if dr := resp.Responses[0].GetResponseDeleteRange(); dr != nil {
		for _, kv := range dr.PrevKvs {
			s.supersede(clientv3.LeaseID(kv.Lease))
		}
	}
	return spate.Won(uint64(resp.Header.Revision)), nil
}

// UpdateAndDelete implements [spate.Releaser] with one transaction: if the
// durable key's ModRevision equals expected, put it and run a nested
// transaction that deletes the ephemeral key if its ModRevision equals
// leaseExpected. Both writes share the transaction's revision, which both
// outcomes report, and reach watchers at once; the ephemeral key's lease
// is revoked in the background, as after a Delete.
func (s *store) UpdateAndDelete(ctx context.Context, durableKey string, value []byte, expected uint64,
	ephemeralKey string, leaseExpected uint64) (spate.Outcome, spate.Outcome, error) {
	if err := s.live(); err != nil {
		return spate.Outcome{}, spate.Outcome{}, err
	}
	rev, ok := revision(expected)
	if !ok {
		return spate.Outcome{}, spate.Outcome{}, nil
	}
	durable, ephemeral := s.key(spate.Durable, durableKey), s.key(spate.Ephemeral, ephemeralKey)
	then := []clientv3.Op{clientv3.OpPut(durable, string(value))}
	if lrev, ok := revision(leaseExpected); ok {
		then = append(then, clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(ephemeral), "=", lrev)},
			[]clientv3.Op{clientv3.OpDelete(ephemeral, clientv3.WithPrevKV())},
			nil))
	}
	resp, err := s.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(durable), "=", rev)).
		Then(then...).
		Commit()
	if err != nil {
		return spate.Outcome{}, spate.Outcome{}, s.classify(ctx, err)
	}
	if !resp.Succeeded {
		return spate.Outcome{}, spate.Outcome{}, nil
	}
	u := spate.Won(uint64(resp.Header.Revision))
	if len(resp.Responses) < 2 {
		return u, spate.Outcome{}, nil
	}
	inner := resp.Responses[1].GetResponseTxn()
	if inner == nil || !inner.Succeeded || len(inner.Responses) == 0 {
		return u, spate.Outcome{}, nil
	}
	if dr := inner.Responses[0].GetResponseDeleteRange(); dr != nil {
		for _, kv := range dr.PrevKvs {
			s.supersede(clientv3.LeaseID(kv.Lease))
		}
	}
	return u, spate.Won(uint64(resp.Header.Revision)), nil
}

// List implements [driver.Driver]: a prefix range read at one revision, in
// pages of 1000 keys.
func (s *store) List(ctx context.Context, ks spate.Keyspace, prefix string) ([]spate.Entry, error) {
	if err := s.live(); err != nil {
		return nil, err
	}
	kvs, _, err := s.rangeAll(ctx, ks, prefix)
	if err != nil {
		return nil, s.classify(ctx, err)
	}
	es := make([]spate.Entry, 0, len(kvs))
	for _, kv := range kvs {
		if k, ok := s.storeKey(ks, kv.Key); ok {
			es = append(es, spate.Entry{Key: k, Value: value(kv), Revision: uint64(kv.ModRevision)})
		}
	}
	return es, nil
}

// rangeAll reads every key under prefix at one revision, which it returns.
// etcd returns keys sorted in byte order.
func (s *store) rangeAll(ctx context.Context, ks spate.Keyspace, prefix string) ([]*mvccpb.KeyValue, int64, error) {
	from := s.key(ks, prefix)
	end := clientv3.GetPrefixRangeEnd(from)
	var (
		kvs []*mvccpb.KeyValue
		rev int64
		key = from
	)
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(listPage)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cli.Get(ctx, key, opts...)
		if err != nil {
			return nil, 0, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		kvs = append(kvs, resp.Kvs...)
		if !resp.More || len(resp.Kvs) == 0 {
			return kvs, rev, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// storeKey maps an etcd key back to a store key. Keys under the prefix that
// are not valid store keys were not written by a spate store; they are
// logged and skipped.
func (s *store) storeKey(ks spate.Keyspace, full []byte) (string, bool) {
	base := s.key(ks, "")
	k, ok := strings.CutPrefix(string(full), base)
	if !ok {
		return "", false
	}
	if err := spate.ValidateKey(k); err != nil {
		s.log.Warn("etcd: skipping a key under the store's prefix that no spate store wrote", "key", string(full), "err", err)
		return "", false
	}
	return k, true
}

func value(kv *mvccpb.KeyValue) []byte {
	if kv.Value == nil {
		return []byte{}
	}
	return kv.Value
}
