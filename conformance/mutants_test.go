package conformance_test

import (
	"bytes"
	"context"
	"fmt"
	"hash/fnv"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/stores/mem"
)

// The suite must catch a driver that breaks any rule. Each mutant below is
// the in-memory store with exactly one rule broken; TestSuiteCatchesMutants
// runs the rules it names against each, in process through CheckStore and in
// virtual time, and requires every one of them to fail.

const ttl = 1500 * time.Millisecond

type mutant struct {
	name   string
	breaks []string // rules the suite must report broken
	// harness builds the mutant's harness (nil: the default, whose stores
	// are wrap(root.Connect())).
	harness func() conformance.Harness
	wrap    func(sh *shared, s *mem.Store) spate.Store
	mem     func(*mem.Options) // tunes the default harness's store
}

// shared is state a mutant keeps across the stores of one harness.
type shared struct {
	mu      sync.Mutex
	base    map[string]uint64 // per-key-version: inner revision before create
	created map[string]time.Time
	deleted map[string]bool
	cache   map[string]spate.Entry
	closed  chan struct{} // closed with the harness: background goroutines stop
	onClose []func()      // run when the harness closes
	stalled bool          // a-stall-past-a-ttl-once: its one stall was made
}

// sibling returns another handle on s's data, closed with the harness: a
// second connection a broken driver might keep.
func (sh *shared) sibling(s *mem.Store) *mem.Store {
	sib, err := s.Connect()
	if err != nil {
		panic(err)
	}
	sh.mu.Lock()
	sh.onClose = append(sh.onClose, func() { _ = sib.Close() })
	sh.mu.Unlock()
	return sib
}

func newShared() *shared {
	return &shared{base: map[string]uint64{}, created: map[string]time.Time{}, deleted: map[string]bool{}, cache: map[string]spate.Entry{},
		closed: make(chan struct{})}
}

// sleep sleeps for d, or until the harness closes; it reports whether the
// harness is still open.
func (sh *shared) sleep(d time.Duration) bool {
	select {
	case <-time.After(d):
		return true
	case <-sh.closed:
		return false
	}
}

// mutants are every store mutant, by area.
var mutants = slices.Concat(opMutants, argMutants, ttlMutants, watchMutants, releaseMutants, watchKeysMutants, sessionMutants)

// opMutants break writes, reads, revisions and listings.
var opMutants = []mutant{
	{name: "create-overwrites", breaks: []string{"CreateIsCreateIfAbsent"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, create: func(ctx context.Context, ks spate.Keyspace, key string, v []byte) (spate.Outcome, error) {
				o, err := s.Create(ctx, ks, key, v)
				if err != nil || o.Won {
					return o, err
				}
				cur, _, _ := s.Get(ctx, ks, key)
				return s.Update(ctx, ks, key, v, cur.Revision)
			}}
		}},
	{name: "update-ignores-revision", breaks: []string{"UpdateIsCompareAndSwap", "ConcurrentCASLosesNoUpdate"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, update: func(ctx context.Context, ks spate.Keyspace, key string, v []byte, _ uint64) (spate.Outcome, error) {
				cur, ok, err := s.Get(ctx, ks, key)
				if err != nil || !ok {
					return spate.Outcome{}, err
				}
				return s.Update(ctx, ks, key, v, cur.Revision)
			}}
		}},
	{name: "update-reuses-revision", breaks: []string{"UpdateIsCompareAndSwap"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, update: func(ctx context.Context, ks spate.Keyspace, key string, v []byte, exp uint64) (spate.Outcome, error) {
				o, err := s.Update(ctx, ks, key, v, exp)
				if o.Won {
					o.Revision = exp
				}
				return o, err
			}}
		}},
	{name: "lost-update-writes", breaks: []string{"UpdateIsCompareAndSwap"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, update: func(ctx context.Context, ks spate.Keyspace, key string, v []byte, exp uint64) (spate.Outcome, error) {
				o, err := s.Update(ctx, ks, key, v, exp)
				if err == nil && !o.Won {
					if cur, ok, _ := s.Get(ctx, ks, key); ok {
						_, _ = s.Update(ctx, ks, key, v, cur.Revision)
					}
				}
				return o, err
			}}
		}},
	{name: "per-key-version", breaks: []string{"RevisionsIncreaseAcrossDeleteAndRecreate"}, wrap: perKeyVersion},
	{name: "guarded-delete-ignores-revision", breaks: []string{"GuardedDelete"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, del: func(ctx context.Context, ks spate.Keyspace, key string, _ uint64) (spate.Outcome, error) {
				if _, ok, _ := s.Get(ctx, ks, key); !ok {
					return spate.Outcome{}, nil
				}
				return s.Delete(ctx, ks, key, spate.AnyRevision)
			}}
		}},
	{name: "delete-leaves-tombstone", breaks: []string{"DeletedKeysReadAbsentAndAreRecreatable"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, del: func(ctx context.Context, ks spate.Keyspace, key string, exp uint64) (spate.Outcome, error) {
				cur, ok, err := s.Get(ctx, ks, key)
				if err != nil || !ok {
					return spate.Outcome{}, err
				}
				if exp != spate.AnyRevision && exp != cur.Revision {
					return spate.Outcome{}, nil
				}
				return s.Update(ctx, ks, key, nil, cur.Revision)
			}}
		}},
	{name: "no-recreate-after-delete", breaks: []string{"DeletedKeysReadAbsentAndAreRecreatable"},
		wrap: func(sh *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s,
				create: func(ctx context.Context, ks spate.Keyspace, key string, v []byte) (spate.Outcome, error) {
					sh.mu.Lock()
					gone := sh.deleted[ks.String()+key]
					sh.mu.Unlock()
					if gone {
						return spate.Outcome{}, nil
					}
					return s.Create(ctx, ks, key, v)
				},
				del: func(ctx context.Context, ks spate.Keyspace, key string, exp uint64) (spate.Outcome, error) {
					o, err := s.Delete(ctx, ks, key, exp)
					if o.Won {
						sh.mu.Lock()
						sh.deleted[ks.String()+key] = true
						sh.mu.Unlock()
					}
					return o, err
				}}
		}},
	{name: "list-under-reports", breaks: []string{"ListNeverUnderReports", "ListReturnsLiveKeys"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, list: func(ctx context.Context, ks spate.Keyspace, p string) ([]spate.Entry, error) {
				es, err := s.List(ctx, ks, p)
				if len(es) > 1 {
					es = es[:len(es)-1]
				}
				return es, err
			}}
		}},
	{name: "list-unsorted", breaks: []string{"ListReturnsLiveKeys"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, list: func(ctx context.Context, ks spate.Keyspace, p string) ([]spate.Entry, error) {
				es, err := s.List(ctx, ks, p)
				slices.Reverse(es)
				return es, err
			}}
		}},
	{name: "non-atomic-cas", breaks: []string{"ConcurrentCASLosesNoUpdate"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, update: func(ctx context.Context, ks spate.Keyspace, key string, v []byte, exp uint64) (spate.Outcome, error) {
				cur, ok, err := s.Get(ctx, ks, key)
				if err != nil || !ok || cur.Revision != exp {
					return spate.Outcome{}, err
				}
				time.Sleep(time.Millisecond) // check, then act: others interleave
				cur, ok, err = s.Get(ctx, ks, key)
				if err != nil || !ok {
					return spate.Outcome{}, err
				}
				return s.Update(ctx, ks, key, v, cur.Revision)
			}}
		}},
	{name: "stale-get", breaks: []string{"GetReadsTheLatestWrite", "UpdateIsCompareAndSwap"},
		wrap: func(sh *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, get: func(ctx context.Context, ks spate.Keyspace, key string) (spate.Entry, bool, error) {
				sh.mu.Lock()
				defer sh.mu.Unlock()
				if en, ok := sh.cache[ks.String()+key]; ok {
					return en, true, nil
				}
				en, ok, err := s.Get(ctx, ks, key)
				if ok {
					sh.cache[ks.String()+key] = en
				}
				return en, ok, err
			}}
		}},
	{name: "keyspaces-shared", breaks: []string{"KeyspacesAreIndependent"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, ks: func(spate.Keyspace) spate.Keyspace { return spate.Durable }}
		}},
	{name: "values-cut-at-nul", breaks: []string{"ValuesRoundTrip"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, create: func(ctx context.Context, ks spate.Keyspace, key string, v []byte) (spate.Outcome, error) {
				if i := bytes.IndexByte(v, 0); i >= 0 {
					v = v[:i] // stored like a C string
				}
				return s.Create(ctx, ks, key, v)
			}}
		}},
	{name: "clients-not-shared", breaks: []string{"ClientsShareOneNamespace"},
		harness: func() conformance.Harness { return &isolated{} }},
	// A driver sharing Delete's "0 is any revision" with Update.
	{name: "update-at-zero-is-unconditional", breaks: []string{"UpdateIsCompareAndSwap"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, update: func(ctx context.Context, ks spate.Keyspace, k string, v []byte, exp uint64) (spate.Outcome, error) {
				if exp == 0 {
					if cur, ok, err := s.Get(ctx, ks, k); err == nil && ok {
						exp = cur.Revision
					}
				}
				return s.Update(ctx, ks, k, v, exp)
			}}
		}},
	// "Nothing deleted" read as a lost condition.
	{name: "absent-delete-loses", breaks: []string{"UnconditionalDeleteWinsEvenWhenAbsent"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, del: func(ctx context.Context, ks spate.Keyspace, k string, exp uint64) (spate.Outcome, error) {
				if _, ok, err := s.Get(ctx, ks, k); err == nil && !ok {
					return spate.Outcome{}, nil
				}
				return s.Delete(ctx, ks, k, exp)
			}}
		}},
	// A transaction's success flag misread: a won update reported lost.
	{name: "won-update-reported-lost", breaks: []string{"OutcomeReportsWhetherTheWriteApplied"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, update: func(ctx context.Context, ks spate.Keyspace, k string, v []byte, exp uint64) (spate.Outcome, error) {
				_, err := s.Update(ctx, ks, k, v, exp)
				return spate.Outcome{}, err
			}}
		}},
	// A failed transaction reporting the key's current revision.
	{name: "lost-outcome-carries-current-revision", breaks: []string{"OutcomeRevisionIsTheRevisionMinted"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, update: func(ctx context.Context, ks spate.Keyspace, k string, v []byte, exp uint64) (spate.Outcome, error) {
				o, err := s.Update(ctx, ks, k, v, exp)
				if err == nil && !o.Won {
					if cur, ok, gerr := s.Get(ctx, ks, k); gerr == nil && ok {
						o.Revision = cur.Revision
					}
				}
				return o, err
			}}
		}},
	// A delete reporting the revision of the value it removed.
	{name: "delete-outcome-reports-old-revision", breaks: []string{"DeleteOutcomeCarriesItsRevision"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, del: func(ctx context.Context, ks spate.Keyspace, k string, exp uint64) (spate.Outcome, error) {
				cur, ok, err := s.Get(ctx, ks, k)
				o, derr := s.Delete(ctx, ks, k, exp)
				if err == nil && ok && o.Won {
					o.Revision = cur.Revision
				}
				return o, derr
			}}
		}},
	// Revisions counted from 0.
	{name: "revision-zero-based", breaks: []string{"LiveRevisionsAreNeverZero"}, wrap: zeroBased},
	// Revisions derived from the content: A, B, A has the first revision
	// again.
	{name: "content-revisions", breaks: []string{"RevisionsAreContentIndependent"}, wrap: contentRevisions},
	// A client that stages every value in one buffer, unlocked across its
	// round trip.
	{name: "shared-value-buffer", breaks: []string{"OneClientIsSafeForConcurrentUse"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			var mu sync.Mutex
			var buf []byte
			return &hooked{Store: s, create: func(ctx context.Context, ks spate.Keyspace, k string, v []byte) (spate.Outcome, error) {
				mu.Lock()
				buf = bytes.Clone(v)
				mu.Unlock()
				time.Sleep(time.Millisecond) // the round trip
				mu.Lock()
				staged := buf
				mu.Unlock()
				return s.Create(ctx, ks, k, staged)
			}}
		}},
	// A NATS-style driver taking an empty payload for a delete marker.
	{name: "empty-value-reads-absent", breaks: []string{"EmptyValuesAreValues"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s,
				get: func(ctx context.Context, ks spate.Keyspace, k string) (spate.Entry, bool, error) {
					en, ok, err := s.Get(ctx, ks, k)
					if ok && len(en.Value) == 0 {
						return spate.Entry{}, false, err
					}
					return en, ok, err
				},
				list: func(ctx context.Context, ks spate.Keyspace, p string) ([]spate.Entry, error) {
					es, err := s.List(ctx, ks, p)
					return slices.DeleteFunc(es, func(en spate.Entry) bool { return len(en.Value) == 0 }), err
				}}
		}},
	// A keys-only listing.
	{name: "list-without-values", breaks: []string{"ListReturnsLiveKeys"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, list: func(ctx context.Context, ks spate.Keyspace, p string) ([]spate.Entry, error) {
				es, err := s.List(ctx, ks, p)
				for i := range es {
					es[i].Value = nil
				}
				return es, err
			}}
		}},
	// A listing read in pages by offset, one round trip each: a delete
	// before the boundary shifts a key past it.
	{name: "list-pages-by-offset", breaks: []string{"ListNeverUnderReports"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, list: func(ctx context.Context, ks spate.Keyspace, p string) ([]spate.Entry, error) {
				const page = 10
				var out []spate.Entry
				for off := 0; ; off += page {
					es, err := s.List(ctx, ks, p)
					if err != nil {
						return nil, err
					}
					if off >= len(es) {
						return out, nil
					}
					out = append(out, es[off:min(off+page, len(es))]...)
					time.Sleep(time.Millisecond) // the next page's round trip
				}
			}}
		}},
}

// controls are the unbroken store, with and without a value cap: every rule
// passes on them.
var controls = []mutant{{name: "none"}, {name: "none-capped", mem: capped}}

// TestSuiteCatchesMutants is the proof that the store suite can fail.
func TestSuiteCatchesMutants(t *testing.T) {
	if os.Getenv("SPATE_MUTANT") != "" {
		t.Skip("inside a mutant run")
	}
	covered := map[string]bool{}
	for _, m := range mutants {
		for _, r := range m.breaks {
			covered[r] = true
		}
	}
	for _, r := range conformance.StoreRules {
		if !covered[r.Name] {
			t.Errorf("rule %s has no mutant proving the suite can catch its violation", r.Name)
		}
	}
	for _, m := range append(controls, mutants...) {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			rules := m.breaks
			if m.breaks == nil {
				for _, r := range conformance.StoreRules {
					rules = append(rules, r.Name)
				}
			}
			failed := catch(t, conformance.CheckStore, mutantHarness(mutants, m.name), rules)
			if m.breaks == nil {
				require.Empty(t, failed, "the unbroken store fails rules:\n%s", verdicts(failed))
				return
			}
			for _, r := range m.breaks {
				require.Contains(t, failed, r, "mutant %q breaks %s, but the suite did not catch it", m.name, r)
				assert.NotEmpty(t, ruleLine(failed[r]), "mutant %q failed %s without a rule: message, so not by the rule's own check:\n%s",
					m.name, r, strings.Join(failed[r], "\n"))
			}
			t.Logf("mutant %q caught:\n%s", m.name, verdicts(failed))
		})
	}
}

// catch runs the named rules of one suite in process, in a synctest
// bubble, and returns what each rule that failed logged.
func catch(t *testing.T, check func(context.Context, conformance.HarnessMaker, ...conformance.Option) error,
	mk conformance.HarnessMaker, rules []string) (failed map[string][]string) {
	t.Helper()
	failed = map[string][]string{}
	synctest.Test(t, func(t *testing.T) {
		keep := func(rule string) bool {
			_, name, _ := strings.Cut(rule, "/")
			return slices.Contains(rules, name)
		}
		ran := 0
		err := check(t.Context(), mk, conformance.Select(keep), conformance.Parallel(64),
			conformance.OnResult(func(r conformance.Result) {
				ran++
				if r.Status == conformance.Failed {
					_, name, _ := strings.Cut(r.Rule, "/")
					failed[name] = r.Log
				}
			}))
		if len(failed) == 0 {
			require.NoError(t, err, "no rule failed, yet the run did")
		} else {
			require.Error(t, err, "rules failed, yet the run returned no error")
		}
		require.Equal(t, len(rules), ran, "the run reported %d rules, not the %d asked for", ran, len(rules))
	})
	return failed
}

// ruleLine is the first line of a rule's log that states a broken rule
// ("rule: ..."), or "" if none does.
func ruleLine(log []string) string {
	for _, entry := range log {
		for _, l := range strings.Split(entry, "\n") {
			if i := strings.Index(l, "rule:"); i >= 0 {
				return l[i:]
			}
		}
	}
	return ""
}

// verdicts reports, for the rules a mutant broke, why each failed.
func verdicts(failed map[string][]string) string {
	var b strings.Builder
	for _, name := range slices.Sorted(maps.Keys(failed)) {
		fmt.Fprintf(&b, "%s: %s\n", name, ruleLine(failed[name]))
	}
	return b.String()
}

var failLine = regexp.MustCompile(`--- FAIL: Test\w*MutantTarget/(\w+)`)

// runTarget runs, in a subprocess, the target test against the named
// mutant, for the suites without an in-process entry point (chaos).
func runTarget(t *testing.T, target, name string, rules []string) ([]string, string) {
	t.Helper()
	pattern := "^" + target + "$"
	if len(rules) > 0 {
		pattern += "/^(" + strings.Join(rules, "|") + ")$"
	}
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run="+pattern, "-test.v", "-test.count=1", "-test.timeout=5m")
	cmd.Env = append(os.Environ(), "SPATE_MUTANT="+name)
	out, err := cmd.CombinedOutput()
	var failed []string
	for _, m := range failLine.FindAllStringSubmatch(string(out), -1) {
		if !slices.Contains(failed, m[1]) {
			failed = append(failed, m[1])
		}
	}
	if err != nil && len(failed) == 0 {
		t.Fatalf("mutant run %q failed without a rule failing: %v\n%s", name, err, out)
	}
	if strings.Contains(string(out), "panic:") {
		t.Logf("mutant run %q panicked:\n%s", name, out)
	}
	return failed, string(out)
}

// mutantHarness makes harnesses for the named mutant ("none": unbroken).
func mutantHarness(list []mutant, name string) conformance.HarnessMaker {
	var m mutant
	for _, x := range append(controls, list...) {
		if x.name == name {
			m = x
		}
	}
	return func(t testing.TB) conformance.Harness {
		if m.harness != nil {
			return m.harness()
		}
		sh := newShared()
		opts := mem.Options{TTL: ttl}
		if m.mem != nil {
			m.mem(&opts)
		}
		h := &harness{root: mem.MustNew(opts), sh: sh}
		if m.wrap != nil {
			h.wrap = func(s *mem.Store) spate.Store { return m.wrap(sh, s) }
		}
		return h
	}
}

// harness hands out wrapped clients of one in-memory store.
type harness struct {
	root *mem.Store
	wrap func(*mem.Store) spate.Store
	sh   *shared // nil: no background goroutines to stop
	once sync.Once
}

func (h *harness) NewStore(context.Context) (spate.Store, error) {
	s, err := h.root.Connect()
	if err != nil || h.wrap == nil {
		return s, err
	}
	return h.wrap(s), nil
}

func (h *harness) Close() error {
	if h.sh != nil {
		h.once.Do(func() {
			close(h.sh.closed)
			h.sh.mu.Lock()
			fs := h.sh.onClose
			h.sh.mu.Unlock()
			for _, f := range fs {
				f()
			}
		})
	}
	return h.root.Close()
}

// isolated gives every client its own store: clients share nothing.
type isolated struct{ stores []*mem.Store }

func (h *isolated) NewStore(context.Context) (spate.Store, error) {
	s := mem.MustNew(mem.Options{TTL: ttl})
	h.stores = append(h.stores, s)
	return s, nil
}

func (h *isolated) Close() error {
	for _, s := range h.stores {
		_ = s.Close()
	}
	return nil
}

// hooked is a store whose primitives can be replaced one by one.
type hooked struct {
	*mem.Store
	create func(context.Context, spate.Keyspace, string, []byte) (spate.Outcome, error)
	update func(context.Context, spate.Keyspace, string, []byte, uint64) (spate.Outcome, error)
	get    func(context.Context, spate.Keyspace, string) (spate.Entry, bool, error)
	del    func(context.Context, spate.Keyspace, string, uint64) (spate.Outcome, error)
	list   func(context.Context, spate.Keyspace, string) ([]spate.Entry, error)
	watch  func(context.Context, spate.Keyspace, string) (<-chan spate.WatchEvent, error)
	filter func(ks spate.Keyspace, ev spate.WatchEvent, seq int) []spate.WatchEvent
	caps   func(spate.Capabilities) spate.Capabilities
	close  func() error
	ctx    func(context.Context) context.Context
	ks     func(spate.Keyspace) spate.Keyspace
	pre    func(context.Context, spate.Keyspace) error
}

func (h *hooked) prep(ctx context.Context, ks spate.Keyspace) (context.Context, spate.Keyspace, error) {
	if h.pre != nil {
		if err := h.pre(ctx, ks); err != nil {
			return ctx, ks, err
		}
	}
	if h.ctx != nil {
		ctx = h.ctx(ctx)
	}
	if h.ks != nil {
		ks = h.ks(ks)
	}
	return ctx, ks, nil
}

func (h *hooked) Capabilities() spate.Capabilities {
	c := h.Store.Capabilities()
	if h.caps != nil {
		c = h.caps(c)
	}
	return c
}

func (h *hooked) Close() error {
	if h.close != nil {
		return h.close()
	}
	return h.Store.Close()
}

func (h *hooked) Create(ctx context.Context, ks spate.Keyspace, key string, v []byte) (spate.Outcome, error) {
	ctx, ks, err := h.prep(ctx, ks)
	if err != nil {
		return spate.Outcome{}, err
	}
	if h.create != nil {
		return h.create(ctx, ks, key, v)
	}
	return h.Store.Create(ctx, ks, key, v)
}

func (h *hooked) Update(ctx context.Context, ks spate.Keyspace, key string, v []byte, exp uint64) (spate.Outcome, error) {
	ctx, ks, err := h.prep(ctx, ks)
	if err != nil {
		return spate.Outcome{}, err
	}
	if h.update != nil {
		return h.update(ctx, ks, key, v, exp)
	}
	return h.Store.Update(ctx, ks, key, v, exp)
}

func (h *hooked) Get(ctx context.Context, ks spate.Keyspace, key string) (spate.Entry, bool, error) {
	ctx, ks, err := h.prep(ctx, ks)
	if err != nil {
		return spate.Entry{}, false, err
	}
	if h.get != nil {
		return h.get(ctx, ks, key)
	}
	return h.Store.Get(ctx, ks, key)
}

func (h *hooked) Delete(ctx context.Context, ks spate.Keyspace, key string, exp uint64) (spate.Outcome, error) {
	ctx, ks, err := h.prep(ctx, ks)
	if err != nil {
		return spate.Outcome{}, err
	}
	if h.del != nil {
		return h.del(ctx, ks, key, exp)
	}
	return h.Store.Delete(ctx, ks, key, exp)
}

func (h *hooked) List(ctx context.Context, ks spate.Keyspace, p string) ([]spate.Entry, error) {
	ctx, ks, err := h.prep(ctx, ks)
	if err != nil {
		return nil, err
	}
	if h.list != nil {
		return h.list(ctx, ks, p)
	}
	return h.Store.List(ctx, ks, p)
}

func (h *hooked) Watch(ctx context.Context, ks spate.Keyspace, p string) (<-chan spate.WatchEvent, error) {
	ctx, ks, err := h.prep(ctx, ks)
	if err != nil {
		return nil, err
	}
	var ch <-chan spate.WatchEvent
	if h.watch != nil {
		ch, err = h.watch(ctx, ks, p)
	} else {
		ch, err = h.Store.Watch(ctx, ks, p)
	}
	if err != nil || h.filter == nil {
		return ch, err
	}
	out := make(chan spate.WatchEvent)
	go func() {
		defer close(out)
		seq := 0
		for ev := range ch {
			for _, x := range h.filter(ks, ev, seq) {
				select {
				case out <- x:
				case <-ctx.Done():
					for range ch {
					}
					return
				}
			}
			seq++
		}
	}()
	return out, nil
}

// perKeyVersion reports revisions as a per-key version that restarts at 1
// when a key is re-created, like etcd's Version field.
func perKeyVersion(sh *shared, s *mem.Store) spate.Store {
	k := func(ks spate.Keyspace, key string) string { return ks.String() + "/" + key }
	base := func(ks spate.Keyspace, key string) uint64 {
		sh.mu.Lock()
		defer sh.mu.Unlock()
		return sh.base[k(ks, key)]
	}
	return &hooked{Store: s,
		create: func(ctx context.Context, ks spate.Keyspace, key string, v []byte) (spate.Outcome, error) {
			o, err := s.Create(ctx, ks, key, v)
			if o.Won {
				sh.mu.Lock()
				sh.base[k(ks, key)] = o.Revision - 1
				sh.mu.Unlock()
				o.Revision = 1
			}
			return o, err
		},
		update: func(ctx context.Context, ks spate.Keyspace, key string, v []byte, exp uint64) (spate.Outcome, error) {
			b := base(ks, key)
			o, err := s.Update(ctx, ks, key, v, exp+b)
			if o.Won {
				o.Revision -= b
			}
			return o, err
		},
		get: func(ctx context.Context, ks spate.Keyspace, key string) (spate.Entry, bool, error) {
			en, ok, err := s.Get(ctx, ks, key)
			if ok {
				en.Revision -= base(ks, key)
			}
			return en, ok, err
		},
		del: func(ctx context.Context, ks spate.Keyspace, key string, exp uint64) (spate.Outcome, error) {
			if exp != spate.AnyRevision {
				exp += base(ks, key)
			}
			o, err := s.Delete(ctx, ks, key, exp)
			o.Revision = 0
			return o, err
		},
		list: func(ctx context.Context, ks spate.Keyspace, p string) ([]spate.Entry, error) {
			es, err := s.List(ctx, ks, p)
			for i := range es {
				es[i].Revision -= base(ks, es[i].Key)
			}
			return es, err
		},
		filter: func(ks spate.Keyspace, ev spate.WatchEvent, _ int) []spate.WatchEvent {
			if ev.Kind == spate.WatchPut || ev.Kind == spate.WatchDelete {
				ev.Revision -= base(ks, ev.Key)
			}
			return []spate.WatchEvent{ev}
		},
	}
}

// ttlFromCreate makes ephemeral keys expire one TTL after their create,
// whatever updates came since: updates do not re-arm.
func ttlFromCreate(sh *shared, s *mem.Store) spate.Store {
	return &hooked{Store: s,
		create: func(ctx context.Context, ks spate.Keyspace, key string, v []byte) (spate.Outcome, error) {
			o, err := s.Create(ctx, ks, key, v)
			if o.Won && ks == spate.Ephemeral {
				sh.mu.Lock()
				sh.created[key] = time.Now()
				sh.mu.Unlock()
			}
			return o, err
		},
		update: func(ctx context.Context, ks spate.Keyspace, key string, v []byte, exp uint64) (spate.Outcome, error) {
			sh.mu.Lock()
			born, ok := sh.created[key]
			sh.mu.Unlock()
			if ks == spate.Ephemeral && ok && time.Since(born) >= ttl {
				_, _ = s.Delete(ctx, ks, key, spate.AnyRevision)
				return spate.Outcome{}, nil
			}
			return s.Update(ctx, ks, key, v, exp)
		}}
}

// zeroBased reports every revision one lower than the store minted, so
// that the first write to a keyspace is at revision 0.
func zeroBased(_ *shared, s *mem.Store) spate.Store {
	up := func(r uint64) uint64 {
		if r == 0 {
			return 0 // AnyRevision stays itself
		}
		return r + 1
	}
	down := func(o spate.Outcome, err error) (spate.Outcome, error) {
		if o.Revision > 0 {
			o.Revision--
		}
		return o, err
	}
	return &hooked{Store: s,
		create: func(ctx context.Context, ks spate.Keyspace, k string, v []byte) (spate.Outcome, error) {
			return down(s.Create(ctx, ks, k, v))
		},
		update: func(ctx context.Context, ks spate.Keyspace, k string, v []byte, exp uint64) (spate.Outcome, error) {
			return down(s.Update(ctx, ks, k, v, exp+1))
		},
		get: func(ctx context.Context, ks spate.Keyspace, k string) (spate.Entry, bool, error) {
			en, ok, err := s.Get(ctx, ks, k)
			if ok {
				en.Revision--
			}
			return en, ok, err
		},
		del: func(ctx context.Context, ks spate.Keyspace, k string, exp uint64) (spate.Outcome, error) {
			return down(s.Delete(ctx, ks, k, up(exp)))
		},
		list: func(ctx context.Context, ks spate.Keyspace, p string) ([]spate.Entry, error) {
			es, err := s.List(ctx, ks, p)
			for i := range es {
				es[i].Revision--
			}
			return es, err
		},
		filter: func(_ spate.Keyspace, ev spate.WatchEvent, _ int) []spate.WatchEvent {
			if ev.Revision > 0 {
				ev.Revision--
			}
			return []spate.WatchEvent{ev}
		}}
}

// contentRevisions reports a hash of the value as the revision and
// compares updates and deletes against it.
func contentRevisions(_ *shared, s *mem.Store) spate.Store {
	hash := func(v []byte) uint64 {
		h := fnv.New64a()
		_, _ = h.Write(v)
		return h.Sum64() | 1
	}
	cur := func(ctx context.Context, ks spate.Keyspace, k string) (spate.Entry, bool) {
		en, ok, err := s.Get(ctx, ks, k)
		return en, ok && err == nil
	}
	return &hooked{Store: s,
		create: func(ctx context.Context, ks spate.Keyspace, k string, v []byte) (spate.Outcome, error) {
			o, err := s.Create(ctx, ks, k, v)
			if o.Won {
				o.Revision = hash(v)
			}
			return o, err
		},
		update: func(ctx context.Context, ks spate.Keyspace, k string, v []byte, exp uint64) (spate.Outcome, error) {
			en, ok := cur(ctx, ks, k)
			if !ok || hash(en.Value) != exp {
				return spate.Outcome{}, nil
			}
			o, err := s.Update(ctx, ks, k, v, en.Revision)
			if o.Won {
				o.Revision = hash(v)
			}
			return o, err
		},
		get: func(ctx context.Context, ks spate.Keyspace, k string) (spate.Entry, bool, error) {
			en, ok, err := s.Get(ctx, ks, k)
			if ok {
				en.Revision = hash(en.Value)
			}
			return en, ok, err
		},
		del: func(ctx context.Context, ks spate.Keyspace, k string, exp uint64) (spate.Outcome, error) {
			if exp != spate.AnyRevision {
				en, ok := cur(ctx, ks, k)
				if !ok || hash(en.Value) != exp {
					return spate.Outcome{}, nil
				}
				exp = en.Revision
			}
			return s.Delete(ctx, ks, k, exp)
		}}
}
