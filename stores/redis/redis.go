package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/driver"
)

// Defaults and limits of [Options].
const (
	// DefaultMaxValueSize caps values at 512 KiB, the same cap as the NATS
	// driver, so a job can move between backends.
	DefaultMaxValueSize = 512 << 10
	// DefaultChangeLogLength is how many changes each keyspace's change log
	// keeps for watchers.
	DefaultChangeLogLength = 10_000
	// DefaultSweepInterval is how often each client runs the expiry sweep.
	DefaultSweepInterval = 250 * time.Millisecond
	// TTLFloor is the smallest TTL the driver accepts. Deadlines are kept
	// in server milliseconds; below this a heartbeat at TTL/3 would spend
	// most of the TTL on round trips.
	TTLFloor = 100 * time.Millisecond
	// ExpirySlack is what [spate.Capabilities.ExpiryLatency] adds to the
	// sweep interval: one sweep round trip and the watcher's read.
	ExpirySlack = 100 * time.Millisecond
	// MinChangeLogLength is the smallest ChangeLogLength accepted.
	MinChangeLogLength = 100
)

const (
	driverName   = "redis"
	layout       = "1" // version of the key layout, recorded per job
	sweepBatch   = 512 // keys one sweep script expires at most
	watchBatch   = 512 // log entries one XREAD returns at most
	startupBound = 10 * time.Second
)

// Options configure a store.
type Options struct {
	// Job names the job. Every key of the job starts with "spate:{Job}:",
	// so all of them share one Redis Cluster hash slot. 1–64 bytes of
	// [A-Za-z0-9_-]. Required.
	Job string
	// TTL of the ephemeral keyspace, at least [TTLFloor]. It is recorded
	// with the job on first use; opening the job with another TTL is a
	// Fatal error. Required.
	TTL time.Duration
	// MaxValueSize caps values in bytes. Zero means [DefaultMaxValueSize].
	MaxValueSize int
	// ChangeLogLength is how many changes each keyspace's change log keeps
	// (approximately: Redis trims whole stream nodes, so it keeps at least
	// this many). A watcher that falls further behind gets a Retryable
	// error and re-watches. The log holds values, so its memory is up to
	// ChangeLogLength times the average value size per keyspace. Zero means
	// [DefaultChangeLogLength]; at least [MinChangeLogLength].
	ChangeLogLength int64
	// SweepInterval is how often this client runs the expiry sweep, which
	// turns ephemeral keys past their deadline into logged deletes. Zero
	// means [DefaultSweepInterval].
	SweepInterval time.Duration
	// Logger receives sweep failures and startup warnings. nil discards.
	Logger *slog.Logger
}

// RequiredCommands are the commands the connection's ACL user must be
// allowed, on the keys "spate:{Job}:*": EVAL and EVALSHA run the scripts,
// XREAD reads the change log, and the scripts call the rest. New checks
// every one of them and fails with a Fatal error naming those that are
// denied. A ClusterClient also needs +cluster|slots to read the slot map.
// The ACL that grants everything the driver uses is [ACLRules].
var RequiredCommands = []string{
	"eval", "evalsha", "xread",
	"time", "incr", "get", "xadd", "zadd", "zrem", "zrangebylex", "zrangebyscore", "zscore", "hget", "hset", "hdel",
}

// PushCommands are the commands that push changes to watches, allowed on
// the shard channels "spate:{Job}:*" (ACL rule &spate:*): the scripts
// publish every change with SPUBLISH, and a store's watches share one
// connection that subscribes with SSUBSCRIBE and drops a key's channel
// with SUNSUBSCRIBE. They are optional: without them a store logs a
// warning naming the denied command, and its watches read the change log
// once a second, so changes reach them up to about two seconds late.
var PushCommands = []string{"spublish", "ssubscribe", "sunsubscribe"}

// CheckCommands are the commands of New's server checks: INFO for the
// version, the eviction policy and the append-only file, CONFIG GET for
// appendfsync. Without them the store still opens, but the settings it
// could not read are reported unmet (Capabilities.UnmetSettings), which
// fails the conformance rule RequiredSettingsAreMet. Note that CONFIG GET
// can read every setting, requirepass included: grant it to a user you
// trust with that, or accept the unverified settings.
var CheckCommands = []string{"info", "config|get"}

// NamespaceCommands are the commands of the deployment's job operations
// (storeurl: Jobs, JobExists, DeleteJob, RecordedTTL; spate jobs, delete
// and conformance): SCAN to find a job's keys, EXISTS, DEL and HGET.
var NamespaceCommands = []string{"scan", "exists", "del", "hget"}

// ACLRules are the ACL rules of a user that may do everything the driver
// does: its keys and channels, and [RequiredCommands], [PushCommands],
// [CheckCommands] and [NamespaceCommands]. As one command:
//
//	ACL SETUSER spate on >secret ~spate:* &spate:* +eval +evalsha +xread +time +incr +get +xadd +zadd +zrem +zrangebylex +zrangebyscore +zscore +hget +hset +hdel +spublish +ssubscribe +sunsubscribe +info +config|get +scan +exists +del
func ACLRules() []string {
	rules := []string{"~spate:*", "&spate:*"}
	seen := map[string]bool{}
	for _, set := range [][]string{RequiredCommands, PushCommands, CheckCommands, NamespaceCommands} {
		for _, c := range set {
			if !seen[c] {
				seen[c] = true
				rules = append(rules, "+"+c)
			}
		}
	}
	return rules
}

// deniedCommand returns the command a NOPERM error names ("... to run the
// 'sunsubscribe' command"), or def.
func deniedCommand(msg, def string) string {
	if _, rest, ok := strings.Cut(msg, "'"); ok {
		if n, _, ok := strings.Cut(rest, "'"); ok && n != "" {
			return strings.ToLower(n)
		}
	}
	return def
}

var jobSyntax = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// Validate reports every violation in o, joined; zero values that have a
// default are valid.
func (o Options) Validate() error {
	var errs []error
	if !jobSyntax.MatchString(o.Job) {
		errs = append(errs, fmt.Errorf("Job %q must be 1-64 bytes of [A-Za-z0-9_-]", o.Job))
	}
	if o.TTL < TTLFloor {
		errs = append(errs, fmt.Errorf("TTL %v is below the floor of %v", o.TTL, TTLFloor))
	}
	if o.MaxValueSize < 0 {
		errs = append(errs, fmt.Errorf("MaxValueSize %d is negative", o.MaxValueSize))
	}
	if o.ChangeLogLength != 0 && o.ChangeLogLength < MinChangeLogLength {
		errs = append(errs, fmt.Errorf("ChangeLogLength %d is below %d", o.ChangeLogLength, MinChangeLogLength))
	}
	if o.SweepInterval < 0 {
		errs = append(errs, fmt.Errorf("SweepInterval %v is negative", o.SweepInterval))
	}
	return errors.Join(errs...)
}

func (o *Options) defaults() {
	if o.MaxValueSize == 0 {
		o.MaxValueSize = DefaultMaxValueSize
	}
	if o.ChangeLogLength == 0 {
		o.ChangeLogLength = DefaultChangeLogLength
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = DefaultSweepInterval
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// keyspaceKeys are the Redis keys and fixed script arguments of one keyspace.
type keyspaceKeys struct {
	keys []string // idx, val, rev, seq, log, dl: KEYS of every script
	log  string
	ttl  string // ARGV[1]: TTL in ms, "0" for durable
}

// Store is a coordination store over one job's keys in Redis. It is safe for
// concurrent use. The portable layer ([driver.PortableStore]) does the
// argument checks and the closed state; the driver below it does the rest.
type Store struct {
	*driver.PortableStore
	s *store
}

// store is the Redis [driver.Driver].
type store struct {
	c      goredis.UniversalClient
	opts   Options
	meta   string
	anchor string // the shard channel the subscriber always holds (watch.go)
	ks     [2]keyspaceKeys
	loglen string
	log    *slog.Logger
	unmet  []string // required settings found unmet at startup

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // sweeper, watches and their subscriber
	hub    hub            // the watches' shared subscriber (watch.go)
	mu     sync.Mutex     // guards hub and closed
	closed bool           // set by Close: the hub starts no subscriber after it

	// ownsClient: the store was opened by URL and closes its client.
	ownsClient bool
}

var (
	_ spate.Store      = (*Store)(nil)
	_ driver.Driver    = (*store)(nil)
	_ spate.Releaser   = (*store)(nil)
	_ spate.KeyWatcher = (*store)(nil)
)

// New opens the job's keyspaces over client, which the store uses but does
// not own: Close leaves it open.
//
// New runs a bounded startup check (at most 10 seconds, or ctx's deadline)
// before it returns: it loads and runs a small script that records the job's
// layout and TTL and checks that the connection's ACL user may run every
// command the driver uses. A server that refuses scripts (EVAL or EVALSHA
// renamed, or denied by ACL), an ACL that denies any command or key the
// driver needs, a failed authentication, or a job opened earlier with
// another TTL is a Fatal error that says what is missing. A server that
// cannot be reached is Retryable.
//
// It then starts this client's expiry sweep, which runs every
// [Options.SweepInterval] until Close.
func New(ctx context.Context, client goredis.UniversalClient, opts Options) (*Store, error) {
	if client == nil {
		return nil, spate.Fatalf("redis: New: client is nil")
	}
	if err := opts.Validate(); err != nil {
		return nil, spate.Fatalf("redis: invalid options: %w", err)
	}
	opts.defaults()
	p := "spate:{" + opts.Job + "}:"
	s := &store{
		c:      client,
		opts:   opts,
		meta:   p + "meta",
		anchor: p + "hub",
		loglen: strconv.FormatInt(opts.ChangeLogLength, 10),
		log:    opts.Logger.With("driver", driverName, "job", opts.Job),
	}
	for i, name := range []string{"d:", "e:"} {
		k := keyspaceKeys{ttl: "0"}
		for _, part := range []string{"idx", "val", "rev", "seq", "log", "dl"} {
			k.keys = append(k.keys, p+name+part)
		}
		k.log = k.keys[4]
		if i == 1 {
			k.ttl = strconv.FormatInt(opts.TTL.Milliseconds(), 10)
		}
		s.ks[i] = k
	}
	if err := s.startupCheck(ctx); err != nil {
		return nil, err
	}
	s.warnIfContextIgnored()
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(1)
	go s.sweepLoop()
	return &Store{PortableStore: driver.NewStore(s), s: s}, nil
}

// startupCheck proves that the server is new enough and runs our scripts
// for this user, and that the job's recorded layout and TTL match.
func (s *store) startupCheck(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, startupBound)
	defer cancel()
	if err := s.checkServerVersion(ctx); err != nil {
		return err
	}
	keys := append([]string{s.meta}, s.ks[0].keys...)
	keys = append(keys, s.ks[1].keys...)
	args := []any{layout, s.ks[1].ttl}
	// EVAL first, then EVALSHA: both must be allowed, since EVALSHA falls
	// back to EVAL whenever the server's script cache is empty (after a
	// restart or a failover).
	res, err := eval(ctx, s.c, "eval", scriptInit.src, keys, args)
	if err != nil {
		return s.startupError(ctx, "eval", err)
	}
	if _, err := eval(ctx, s.c, "evalsha", scriptInit.Hash(), keys, args); err != nil {
		return s.startupError(ctx, "evalsha", err)
	}
	vals, _ := res.([]any)
	if len(vals) == 0 {
		return spate.Fatalf("redis: job %q: startup check returned %v", s.opts.Job, res)
	}
	strs := make([]string, len(vals))
	for i, v := range vals {
		strs[i] = fmt.Sprint(v)
	}
	if strs[0] == "denied" {
		return spate.Fatalf("redis: job %q: ACL user %s lacks %s, which the driver needs (see the package doc for the full ACL rule)",
			s.opts.Job, s.whoami(ctx), strings.Join(strs[1:], ", "))
	}
	if len(strs) != 4 || strs[0] != "ok" {
		return spate.Fatalf("redis: job %q: startup check returned %v", s.opts.Job, strs)
	}
	if strs[1] != layout {
		return spate.Fatalf("redis: job %q was written with key layout %q; this driver uses %q: open it with a matching driver or use a new job name",
			s.opts.Job, strs[1], layout)
	}
	if strs[2] != s.ks[1].ttl {
		return spate.Fatalf("redis: job %q was opened with a TTL of %sms, this store asks for %sms: the TTL cannot change mid-job; finish the job or delete its keys (spate:{%s}:*)",
			s.opts.Job, strs[2], s.ks[1].ttl, s.opts.Job)
	}
	if strs[3] != "push" {
		s.hub.polling = true
		s.log.Warn(fmt.Sprintf("the ACL user may not publish on the job's channels (grant +%s, or &spate:* if it lacks the channel rule); "+
			"watches read the change log once a second instead of hearing of changes", deniedCommand(strs[3], "spublish")), "err", strs[3])
	}
	// Watches read the change log with XREAD, outside any script.
	err = s.c.XRead(ctx, &goredis.XReadArgs{
		Streams: []string{s.ks[1].log, "18446744073709551615-18446744073709551615"},
		Count:   1,
		Block:   -1,
	}).Err()
	if err != nil && !errors.Is(err, goredis.Nil) {
		return s.startupError(ctx, "xread", err)
	}
	return nil
}

// startupError turns a failed startup command into an error that names what
// is missing.
func (s *store) startupError(ctx context.Context, cmd string, err error) error {
	msg := err.Error()
	if short, _, ok := strings.Cut(msg, ", with args beginning with"); ok {
		// The server echoes the script's source; keep the message short.
		err = &trimmedError{msg: short, err: err}
	}
	switch errorCode(msg) {
	case "NOPERM":
		if strings.Contains(msg, "access one of the keys") {
			return fmt.Errorf("redis: job %q: ACL user %s lacks access to the job's keys (spate:{%s}:*; grant ~spate:* or narrower): %w: %w",
				s.opts.Job, s.whoami(ctx), s.opts.Job, err, spate.ErrFatal)
		}
		name := deniedCommand(msg, strings.ToLower(cmd))
		why := "the driver runs every operation as a Lua script and needs +eval, +evalsha and +xread"
		if strings.HasPrefix(name, "cluster") {
			why = "a ClusterClient reads the slot map with it"
		} else if !slices.Contains(RequiredCommands, name) {
			why = "the client sent it while connecting or routing"
		}
		return fmt.Errorf("redis: job %q: the server refuses the driver: ACL user %s lacks +%s (%s): %w: %w",
			s.opts.Job, s.whoami(ctx), name, why, err, spate.ErrFatal)
	case "NOAUTH", "WRONGPASS":
		return fmt.Errorf("redis: job %q: authentication failed; check the client's Username and Password: %w: %w",
			s.opts.Job, err, spate.ErrFatal)
	}
	if strings.HasPrefix(msg, "ERR unknown command") {
		return fmt.Errorf("redis: job %q: the server does not accept %s (renamed or disabled with rename-command); the driver runs every operation as a Lua script and needs EVAL and EVALSHA: %w: %w",
			s.opts.Job, strings.ToUpper(cmd), err, spate.ErrFatal)
	}
	return fmt.Errorf("redis: job %q: startup check (%s): %w: %w", s.opts.Job, cmd, err, classOf(err))
}

// trimmedError shortens a server error's message and keeps the error.
type trimmedError struct {
	msg string
	err error
}

func (e *trimmedError) Error() string { return e.msg }
func (e *trimmedError) Unwrap() error { return e.err }

// whoami names the connection's ACL user for error messages.
func (s *store) whoami(ctx context.Context) string {
	if name, err := s.c.Do(ctx, "ACL", "WHOAMI").Text(); err == nil {
		return strconv.Quote(name)
	}
	// ACL WHOAMI may be denied too; fall back to the configured name.
	name := ""
	switch c := s.c.(type) {
	case *goredis.Client:
		name = c.Options().Username
	case *goredis.ClusterClient:
		name = c.Options().Username
	default:
		return "(the connection's user)"
	}
	if name == "" {
		name = "default"
	}
	return strconv.Quote(name)
}

// warnIfContextIgnored logs when the client ignores context deadlines, which
// then do not bound socket I/O (the client's own timeouts still do).
func (s *store) warnIfContextIgnored() {
	var enabled bool
	switch c := s.c.(type) {
	case *goredis.Client:
		enabled = c.Options().ContextTimeoutEnabled
	case *goredis.ClusterClient:
		enabled = c.Options().ContextTimeoutEnabled
	default:
		return
	}
	if !enabled {
		s.log.Warn("redis client has ContextTimeoutEnabled=false: context deadlines do not bound socket I/O, only the client's ReadTimeout and WriteTimeout do")
	}
}

// Capabilities implements [driver.Driver].
func (s *store) Capabilities() spate.Capabilities {
	return spate.Capabilities{
		Driver:               driverName,
		TTL:                  s.opts.TTL,
		TTLFloor:             TTLFloor,
		ExpiryLatency:        s.opts.SweepInterval + ExpirySlack,
		MaxValueSize:         s.opts.MaxValueSize,
		LinearizableFailover: false,
		Durability: "fencing holds on one primary with AOF appendfsync always; across a failover it is best effort " +
			"because replication is asynchronous (a promoted replica may miss the newest writes)",
		RequiredSettings: []string{
			"appendonly yes",
			"appendfsync always (for committed writes to survive a server crash)",
			"Lua scripting allowed: EVAL and EVALSHA not renamed, and the ACL user granted the commands listed in the package doc",
			"maxmemory-policy noeviction or a volatile-* policy (the driver's keys carry no Redis TTL; allkeys-* policies could evict them)",
		},
		UnmetSettings: slices.Clone(s.unmet),
	}
}

// Close stops this client's sweep and ends its watches: their channels
// close at once, and Close returns when their reads of the change log and
// their subscriber connection have ended.
// It does not close a client the caller passed to New (a store opened by
// URL closes the client it made). The portable layer calls it once.
func (s *store) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	if s.ownsClient {
		_ = s.c.Close()
	}
	return nil
}

func (s *store) space(ks spate.Keyspace) *keyspaceKeys { return &s.ks[ks-1] }

// args builds a script's ARGV: the keyspace's TTL, the log length, then rest.
func (s *store) args(k *keyspaceKeys, rest ...any) []any {
	return append([]any{k.ttl, s.loglen}, rest...)
}

// Create implements [driver.Driver].
func (s *store) Create(ctx context.Context, ks spate.Keyspace, key string, value []byte) (spate.Outcome, error) {
	k := s.space(ks)
	res, err := run(ctx, s.c, scriptCreate, k.keys, s.args(k, key, value)...)
	return outcome(res, err)
}

// Update implements [driver.Driver].
func (s *store) Update(ctx context.Context, ks spate.Keyspace, key string, value []byte, expected uint64) (spate.Outcome, error) {
	k := s.space(ks)
	res, err := run(ctx, s.c, scriptUpdate, k.keys, s.args(k, key, value, strconv.FormatUint(expected, 10))...)
	return outcome(res, err)
}

// Delete implements [driver.Driver].
func (s *store) Delete(ctx context.Context, ks spate.Keyspace, key string, expected uint64) (spate.Outcome, error) {
	k := s.space(ks)
	res, err := run(ctx, s.c, scriptDelete, k.keys, s.args(k, key, strconv.FormatUint(expected, 10))...)
	return outcome(res, err)
}

// UpdateAndDelete implements [spate.Releaser] with one script over both
// keyspaces' keys, which share the job's hash tag: the durable update and,
// if it wins, the guarded ephemeral delete, each minted, logged and
// published on its own keyspace as Update and Delete do.
func (s *store) UpdateAndDelete(ctx context.Context, durableKey string, value []byte, expected uint64,
	ephemeralKey string, leaseExpected uint64) (spate.Outcome, spate.Outcome, error) {
	d, e := s.space(spate.Durable), s.space(spate.Ephemeral)
	keys := slices.Concat(d.keys, e.keys)
	res, err := run(ctx, s.c, scriptRelease, keys, s.args(d, durableKey, value, strconv.FormatUint(expected, 10),
		e.ttl, ephemeralKey, strconv.FormatUint(leaseExpected, 10))...)
	if err != nil {
		return spate.Outcome{}, spate.Outcome{}, wrapErr(err)
	}
	vals, ok := res.([]any)
	if !ok || len(vals) == 0 {
		return spate.Outcome{}, spate.Outcome{}, badReply(res)
	}
	if won, _ := vals[0].(int64); won == 0 {
		return spate.Outcome{}, spate.Outcome{}, nil
	}
	if len(vals) < 2 || len(vals) > 3 {
		return spate.Outcome{}, spate.Outcome{}, badReply(res)
	}
	rev, err := parseRev(vals[1])
	if err != nil {
		return spate.Outcome{}, spate.Outcome{}, badReply(res)
	}
	if len(vals) == 2 {
		return spate.Won(rev), spate.Outcome{}, nil
	}
	drev, err := parseRev(vals[2])
	if err != nil {
		return spate.Outcome{}, spate.Outcome{}, badReply(res)
	}
	return spate.Won(rev), spate.Won(drev), nil
}

// outcome decodes {1, rev} or {0}.
func outcome(res any, err error) (spate.Outcome, error) {
	if err != nil {
		return spate.Outcome{}, wrapErr(err)
	}
	vals, ok := res.([]any)
	if !ok || len(vals) == 0 {
		return spate.Outcome{}, badReply(res)
	}
	if won, _ := vals[0].(int64); won == 0 {
		return spate.Outcome{}, nil
	}
	if len(vals) != 2 {
		return spate.Outcome{}, badReply(res)
	}
	rev, err := parseRev(vals[1])
	if err != nil {
		return spate.Outcome{}, badReply(res)
	}
	return spate.Won(rev), nil
}

func badReply(res any) error {
	return fmt.Errorf("unexpected script reply %v: %w", res, spate.ErrFatal)
}

func parseRev(v any) (uint64, error) {
	switch v := v.(type) {
	case string:
		return strconv.ParseUint(v, 10, 64)
	case int64:
		if v >= 0 {
			return uint64(v), nil
		}
	}
	return 0, fmt.Errorf("not a revision: %v", v)
}

// Get implements [driver.Driver].
func (s *store) Get(ctx context.Context, ks spate.Keyspace, key string) (spate.Entry, bool, error) {
	k := s.space(ks)
	res, err := run(ctx, s.c, scriptGet, k.keys, s.args(k, key)...)
	if err != nil {
		return spate.Entry{}, false, wrapErr(err)
	}
	vals, ok := res.([]any)
	if !ok {
		return spate.Entry{}, false, badReply(res)
	}
	if len(vals) == 0 {
		return spate.Entry{}, false, nil
	}
	if len(vals) != 2 {
		return spate.Entry{}, false, badReply(res)
	}
	rev, err := parseRev(vals[0])
	value, isStr := vals[1].(string)
	if err != nil || !isStr {
		return spate.Entry{}, false, badReply(res)
	}
	return spate.Entry{Key: key, Value: []byte(value), Revision: rev}, true, nil
}

// List implements [driver.Driver].
func (s *store) List(ctx context.Context, ks spate.Keyspace, prefix string) ([]spate.Entry, error) {
	_, es, err := s.snapshot(ctx, ks, prefix)
	return es, err
}

// snapshot returns the live keys under prefix and the keyspace's last
// revision, read atomically.
func (s *store) snapshot(ctx context.Context, ks spate.Keyspace, prefix string) (uint64, []spate.Entry, error) {
	lo, hi := "-", "+"
	if prefix != "" {
		// Keys hold no byte 0xff, so every key under prefix sorts below
		// prefix+"\xff", and nothing else between the two bounds.
		lo, hi = "["+prefix, "("+prefix+"\xff"
	}
	k := s.space(ks)
	return parseSnapshot(run(ctx, s.c, scriptSnapshot, k.keys, s.args(k, lo, hi)...))
}

// snapshotKeys returns the live keys of keys (sorted, distinct) and the
// keyspace's last revision, read atomically.
func (s *store) snapshotKeys(ctx context.Context, ks spate.Keyspace, keys []string) (uint64, []spate.Entry, error) {
	k := s.space(ks)
	args := make([]any, len(keys))
	for i, key := range keys {
		args[i] = key
	}
	return parseSnapshot(run(ctx, s.c, scriptKeys, k.keys, s.args(k, args...)...))
}

// parseSnapshot decodes a snapshot script's reply: the last revision, then
// key, value, revision triples.
func parseSnapshot(res any, err error) (uint64, []spate.Entry, error) {
	if err != nil {
		return 0, nil, wrapErr(err)
	}
	vals, ok := res.([]any)
	if !ok || len(vals)%3 != 1 {
		return 0, nil, badReply(res)
	}
	last, err := parseRev(vals[0])
	if err != nil {
		return 0, nil, badReply(res)
	}
	var es []spate.Entry
	for i := 1; i < len(vals); i += 3 {
		key, ok1 := vals[i].(string)
		value, ok2 := vals[i+1].(string)
		rev, err := parseRev(vals[i+2])
		if !ok1 || !ok2 || err != nil {
			return 0, nil, badReply(res)
		}
		es = append(es, spate.Entry{Key: key, Value: []byte(value), Revision: rev})
	}
	return last, es, nil
}

// sweepLoop runs the expiry sweep every SweepInterval until Close.
func (s *store) sweepLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.SweepInterval)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		for {
			n, err := s.sweep(s.ctx)
			if err != nil {
				if s.ctx.Err() != nil {
					return
				}
				if !failing {
					s.log.Warn("expiry sweep failed; reads still hide expired keys, but watchers hear of expiry late until it recovers",
						"err", err)
				}
				failing = true
				break
			}
			if failing {
				s.log.Info("expiry sweep recovered")
				failing = false
			}
			if n < sweepBatch {
				break
			}
		}
	}
}

// sweep expires one batch of due ephemeral keys and returns how many.
func (s *store) sweep(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, max(4*s.opts.SweepInterval, 2*time.Second))
	defer cancel()
	k := s.space(spate.Ephemeral)
	res, err := run(ctx, s.c, scriptSweep, k.keys, s.args(k, sweepBatch)...)
	if err != nil {
		return 0, fmt.Errorf("redis: sweep: %w", wrapErr(err))
	}
	n, _ := res.(int64)
	return n, nil
}
