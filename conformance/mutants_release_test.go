package conformance_test

import (
	"context"
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

// releasing is a mutant store whose UpdateAndDelete is ud; the rest is the
// hooked mem store (which reports the capability).
type releasing struct {
	*hooked
	ud func(ctx context.Context, dk string, v []byte, exp uint64, ek string, lexp uint64) (spate.Outcome, spate.Outcome, error)
}

func (r *releasing) UpdateAndDelete(ctx context.Context, dk string, v []byte, exp uint64, ek string, lexp uint64) (spate.Outcome, spate.Outcome, error) {
	return r.ud(ctx, dk, v, exp, ek, lexp)
}

// hidesReleaser wraps a store without passing UpdateAndDelete on, but
// passes the Capabilities that report it: the wrapper bug.
type hidesReleaser struct{ s spate.Store }

func (h hidesReleaser) Capabilities() spate.Capabilities { return h.s.Capabilities() }
func (h hidesReleaser) Close() error                     { return h.s.Close() }
func (h hidesReleaser) Create(ctx context.Context, ks spate.Keyspace, k string, v []byte) (spate.Outcome, error) {
	return h.s.Create(ctx, ks, k, v)
}
func (h hidesReleaser) Update(ctx context.Context, ks spate.Keyspace, k string, v []byte, exp uint64) (spate.Outcome, error) {
	return h.s.Update(ctx, ks, k, v, exp)
}
func (h hidesReleaser) Get(ctx context.Context, ks spate.Keyspace, k string) (spate.Entry, bool, error) {
	return h.s.Get(ctx, ks, k)
}
func (h hidesReleaser) Delete(ctx context.Context, ks spate.Keyspace, k string, exp uint64) (spate.Outcome, error) {
	return h.s.Delete(ctx, ks, k, exp)
}
func (h hidesReleaser) Watch(ctx context.Context, ks spate.Keyspace, p string) (<-chan spate.WatchEvent, error) {
	return h.s.Watch(ctx, ks, p)
}
func (h hidesReleaser) List(ctx context.Context, ks spate.Keyspace, p string) ([]spate.Entry, error) {
	return h.s.List(ctx, ks, p)
}

// releaseMutants break the rules of the optional Releaser capability.
var releaseMutants = []mutant{
	{name: "reports-releaser-without-it", breaks: []string{"ReleaserIsReported"},
		wrap: func(_ *shared, s *mem.Store) spate.Store { return hidesReleaser{s} }},
	{name: "release-skips-the-delete", breaks: []string{"ReleaseUpdatesAndDeletes"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &releasing{hooked: &hooked{Store: s}, ud: func(ctx context.Context, dk string, v []byte, exp uint64, _ string, _ uint64) (spate.Outcome, spate.Outcome, error) {
				u, err := s.Update(ctx, spate.Durable, dk, v, exp)
				return u, spate.Outcome{}, err
			}}
		}},
	{name: "release-deletes-after-lost-update", breaks: []string{"ReleaseLostUpdateWritesNothing"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &releasing{hooked: &hooked{Store: s}, ud: func(ctx context.Context, dk string, v []byte, exp uint64, ek string, lexp uint64) (spate.Outcome, spate.Outcome, error) {
				u, d, err := s.UpdateAndDelete(ctx, dk, v, exp, ek, lexp)
				if err == nil && !u.Won {
					_, err = s.Delete(ctx, spate.Ephemeral, ek, lexp)
				}
				return u, d, err
			}}
		}},
	{name: "release-ignores-the-lease-guard", breaks: []string{"ReleaseLostGuardKeepsTheUpdate"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &releasing{hooked: &hooked{Store: s}, ud: func(ctx context.Context, dk string, v []byte, exp uint64, ek string, _ uint64) (spate.Outcome, spate.Outcome, error) {
				u, err := s.Update(ctx, spate.Durable, dk, v, exp)
				if err != nil || !u.Won {
					return u, spate.Outcome{}, err
				}
				d, err := s.Delete(ctx, spate.Ephemeral, ek, spate.AnyRevision)
				return u, d, err
			}}
		}},
	{name: "release-lost-guard-undoes-the-update", breaks: []string{"ReleaseLostGuardKeepsTheUpdate"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &releasing{hooked: &hooked{Store: s}, ud: func(ctx context.Context, dk string, v []byte, exp uint64, ek string, lexp uint64) (spate.Outcome, spate.Outcome, error) {
				if e, ok, err := s.Get(ctx, spate.Ephemeral, ek); err != nil || !ok || e.Revision != lexp {
					return spate.Outcome{}, spate.Outcome{}, err
				}
				return s.UpdateAndDelete(ctx, dk, v, exp, ek, lexp)
			}}
		}},
	{name: "release-reports-old-revisions", breaks: []string{"ReleaseOutcomesCarryTheirRevisions"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &releasing{hooked: &hooked{Store: s}, ud: func(ctx context.Context, dk string, v []byte, exp uint64, ek string, lexp uint64) (spate.Outcome, spate.Outcome, error) {
				u, d, err := s.UpdateAndDelete(ctx, dk, v, exp, ek, lexp)
				if u.Won {
					u.Revision = exp
				}
				if d.Won {
					d.Revision = lexp
				}
				return u, d, err
			}}
		}},
	{name: "release-deletes-then-updates", breaks: []string{"ReleaseIsSeenAtOnce"},
		wrap: func(sh *shared, s *mem.Store) spate.Store {
			return &releasing{hooked: &hooked{Store: s}, ud: func(ctx context.Context, dk string, v []byte, exp uint64, ek string, lexp uint64) (spate.Outcome, spate.Outcome, error) {
				if e, ok, err := s.Get(ctx, spate.Durable, dk); err != nil || !ok || e.Revision != exp {
					return spate.Outcome{}, spate.Outcome{}, err
				}
				d, err := s.Delete(ctx, spate.Ephemeral, ek, lexp)
				if err != nil {
					return spate.Outcome{}, spate.Outcome{}, err
				}
				sh.sleep(20 * time.Millisecond) // two round trips, the delete first
				u, err := s.Update(ctx, spate.Durable, dk, v, exp)
				return u, d, err
			}}
		}},
	{name: "release-delete-not-watched", breaks: []string{"ReleaseIsSeenAtOnce"},
		wrap: func(sh *shared, s *mem.Store) spate.Store {
			// The lease delete is made but never reaches the ephemeral
			// keyspace's watchers (a driver that logs one keyspace's change).
			return &releasing{
				hooked: &hooked{Store: s, filter: func(ks spate.Keyspace, ev spate.WatchEvent, _ int) []spate.WatchEvent {
					sh.mu.Lock()
					drop := ks == spate.Ephemeral && ev.Kind == spate.WatchDelete && sh.deleted[ev.Key]
					sh.mu.Unlock()
					if drop {
						return nil
					}
					return []spate.WatchEvent{ev}
				}},
				ud: func(ctx context.Context, dk string, v []byte, exp uint64, ek string, lexp uint64) (spate.Outcome, spate.Outcome, error) {
					sh.mu.Lock()
					sh.deleted[ek] = true
					sh.mu.Unlock()
					return s.UpdateAndDelete(ctx, dk, v, exp, ek, lexp)
				}}
		}},
	{name: "release-at-any-revision-deletes", breaks: []string{"ReleaseAtAnyRevisionIsAPlainUpdate"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &releasing{hooked: &hooked{Store: s}, ud: func(ctx context.Context, dk string, v []byte, exp uint64, ek string, lexp uint64) (spate.Outcome, spate.Outcome, error) {
				if lexp != spate.AnyRevision {
					return s.UpdateAndDelete(ctx, dk, v, exp, ek, lexp)
				}
				u, err := s.Update(ctx, spate.Durable, dk, v, exp)
				if err != nil || !u.Won {
					return u, spate.Outcome{}, err
				}
				d, err := s.Delete(ctx, spate.Ephemeral, ek, spate.AnyRevision)
				return u, d, err
			}}
		}},
	{name: "release-swallows-errors", breaks: []string{"ReleaseArgumentsAndCloseAreChecked"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &releasing{hooked: &hooked{Store: s}, ud: func(ctx context.Context, dk string, v []byte, exp uint64, ek string, lexp uint64) (spate.Outcome, spate.Outcome, error) {
				u, d, err := s.UpdateAndDelete(ctx, dk, v, exp, ek, lexp)
				if err != nil {
					return spate.Outcome{}, spate.Outcome{}, nil
				}
				return u, d, nil
			}}
		}},
}

// withoutReleaser is the mem store with the capability hidden as a wrapper
// should hide it: the flag cleared (the method is still there, unused).
type withoutReleaser struct{ *mem.Store }

func (w withoutReleaser) Capabilities() spate.Capabilities {
	c := w.Store.Capabilities()
	c.UpdateAndDelete = false
	return c
}

// A store without the capability skips its rules, visibly: each comes back
// Skipped, with the reason in its log.
func TestReleaseRulesSkipWithoutTheCapability(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu      sync.Mutex
			results = map[string]conformance.Result{}
		)
		release := func(rule string) bool {
			_, name, _ := strings.Cut(rule, "/")
			return strings.HasPrefix(name, "Release")
		}
		mk := func(testing.TB) conformance.Harness {
			return &harness{root: mem.MustNew(mem.Options{TTL: ttl}), wrap: func(s *mem.Store) spate.Store { return withoutReleaser{s} }}
		}
		err := conformance.CheckStore(t.Context(), mk, conformance.Select(release),
			conformance.OnResult(func(r conformance.Result) {
				mu.Lock()
				defer mu.Unlock()
				results[r.Rule] = r
			}))
		require.NoError(t, err)
		n := 0
		for _, r := range conformance.StoreRules {
			if !release("Store/" + r.Name) {
				continue
			}
			n++
			res := results["Store/"+r.Name]
			assert.Equal(t, conformance.Skipped, res.Status, "%s: %v", r.Name, res.Log)
			assert.Contains(t, strings.Join(res.Log, "\n"), "does not have the optional spate.Releaser capability", r.Name)
		}
		assert.Equal(t, 8, n, "the Releaser rules")
	})
}
