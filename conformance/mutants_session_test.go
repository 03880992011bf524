package conformance_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/stores/mem"
)

// sessioning is a mutant store whose NewSession is ns; the rest is the
// hooked mem store (which reports the capability).
type sessioning struct {
	*hooked
	ns func(ctx context.Context) (spate.Session, error)
}

func (s *sessioning) NewSession(ctx context.Context) (spate.Session, error) { return s.ns(ctx) }

// hookedSession is a session whose calls, where set, are replaced.
type hookedSession struct {
	spate.Session
	create    func(ctx context.Context, key string, v []byte) (spate.Outcome, error)
	update    func(ctx context.Context, key string, v []byte, exp uint64) (spate.Outcome, error)
	keepAlive func(ctx context.Context) error
	close     func() error
}

func (h *hookedSession) Create(ctx context.Context, key string, v []byte) (spate.Outcome, error) {
	if h.create != nil {
		return h.create(ctx, key, v)
	}
	return h.Session.Create(ctx, key, v)
}

func (h *hookedSession) Update(ctx context.Context, key string, v []byte, exp uint64) (spate.Outcome, error) {
	if h.update != nil {
		return h.update(ctx, key, v, exp)
	}
	return h.Session.Update(ctx, key, v, exp)
}

func (h *hookedSession) KeepAlive(ctx context.Context) error {
	if h.keepAlive != nil {
		return h.keepAlive(ctx)
	}
	return h.Session.KeepAlive(ctx)
}

func (h *hookedSession) Close() error {
	if h.close != nil {
		return h.close()
	}
	return h.Session.Close()
}

// withSessions makes a mutant whose sessions are mem's, changed by hook.
func withSessions(hook func(sh *shared, s *mem.Store, in spate.Session) spate.Session) func(*shared, *mem.Store) spate.Store {
	return func(sh *shared, s *mem.Store) spate.Store {
		return &sessioning{hooked: &hooked{Store: s}, ns: func(ctx context.Context) (spate.Session, error) {
			in, err := s.NewSession(ctx)
			if err != nil {
				return nil, err
			}
			return hook(sh, s, in), nil
		}}
	}
}

// sessionMutants break the rules of the optional Sessioner capability.
var sessionMutants = []mutant{
	{name: "reports-sessions-without-it", breaks: []string{"SessionerIsReported"},
		wrap: func(_ *shared, s *mem.Store) spate.Store { return hidesReleaser{s} }},
	{name: "keepalive-does-nothing", breaks: []string{"SessionKeysLiveWhileKeptAlive"},
		wrap: withSessions(func(_ *shared, _ *mem.Store, in spate.Session) spate.Session {
			return &hookedSession{Session: in, keepAlive: func(context.Context) error { return nil }}
		})},
	{name: "bound-keys-never-expire", breaks: []string{"SessionKeysLiveWhileKeptAlive", "ExpiredSessionFails"},
		wrap: withSessions(func(sh *shared, _ *mem.Store, in spate.Session) spate.Session {
			// A keeper renews the session behind the caller's back until
			// the session or the harness closes.
			done := make(chan struct{})
			var once sync.Once
			go func() {
				for {
					select {
					case <-done:
						return
					default:
					}
					if !sh.sleep(ttl/3) || in.KeepAlive(context.Background()) != nil {
						return
					}
				}
			}()
			return &hookedSession{Session: in,
				keepAlive: func(context.Context) error { return nil },
				close: func() error {
					once.Do(func() { close(done) })
					return in.Close()
				}}
		})},
	{name: "keepalive-rewrites-keys", breaks: []string{"KeepAliveWritesNothing"},
		wrap: withSessions(func(_ *shared, s *mem.Store, in spate.Session) spate.Session {
			var (
				mu   sync.Mutex
				keys = map[string]bool{}
			)
			track := func(key string, o spate.Outcome, err error) (spate.Outcome, error) {
				if err == nil && o.Won {
					mu.Lock()
					keys[key] = true
					mu.Unlock()
				}
				return o, err
			}
			return &hookedSession{Session: in,
				create: func(ctx context.Context, key string, v []byte) (spate.Outcome, error) {
					o, err := in.Create(ctx, key, v)
					return track(key, o, err)
				},
				update: func(ctx context.Context, key string, v []byte, exp uint64) (spate.Outcome, error) {
					o, err := in.Update(ctx, key, v, exp)
					return track(key, o, err)
				},
				// The lease renewal as one write per key: what sessions
				// exist to avoid.
				keepAlive: func(ctx context.Context) error {
					if err := in.KeepAlive(ctx); err != nil {
						return err
					}
					mu.Lock()
					defer mu.Unlock()
					for k := range keys {
						if cur, ok, err := s.Get(ctx, spate.Ephemeral, k); err == nil && ok {
							_, _ = in.Update(ctx, k, cur.Value, cur.Revision)
						}
					}
					return nil
				}}
		})},
	{name: "session-create-overwrites", breaks: []string{"SessionCreateAndUpdateAreFenced"},
		wrap: withSessions(func(_ *shared, s *mem.Store, in spate.Session) spate.Session {
			return &hookedSession{Session: in, create: func(ctx context.Context, key string, v []byte) (spate.Outcome, error) {
				o, err := in.Create(ctx, key, v)
				if err != nil || o.Won {
					return o, err
				}
				cur, _, _ := s.Get(ctx, spate.Ephemeral, key)
				return in.Update(ctx, key, v, cur.Revision)
			}}
		})},
	{name: "session-update-does-not-bind", breaks: []string{"SessionCreateAndUpdateAreFenced"},
		wrap: withSessions(func(_ *shared, s *mem.Store, in spate.Session) spate.Session {
			return &hookedSession{Session: in, update: func(ctx context.Context, key string, v []byte, exp uint64) (spate.Outcome, error) {
				return s.Update(ctx, spate.Ephemeral, key, v, exp)
			}}
		})},
	{name: "store-update-keeps-binding", breaks: []string{"StoreUpdateUnbinds"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			var (
				mu    sync.Mutex
				bound = map[string]spate.Session{}
			)
			h := &hooked{Store: s, update: func(ctx context.Context, ks spate.Keyspace, key string, v []byte, exp uint64) (spate.Outcome, error) {
				mu.Lock()
				sess := bound[key]
				mu.Unlock()
				if ks == spate.Ephemeral && sess != nil {
					return sess.Update(ctx, key, v, exp)
				}
				return s.Update(ctx, ks, key, v, exp)
			}}
			return &sessioning{hooked: h, ns: func(ctx context.Context) (spate.Session, error) {
				in, err := s.NewSession(ctx)
				if err != nil {
					return nil, err
				}
				return &hookedSession{Session: in, create: func(ctx context.Context, key string, v []byte) (spate.Outcome, error) {
					o, err := in.Create(ctx, key, v)
					if err == nil && o.Won {
						mu.Lock()
						bound[key] = in
						mu.Unlock()
					}
					return o, err
				}}, nil
			}}
		}},
	{name: "session-hides-expiry", breaks: []string{"ExpiredSessionFails"},
		wrap: withSessions(func(_ *shared, _ *mem.Store, in spate.Session) spate.Session {
			return &hookedSession{Session: in, keepAlive: func(ctx context.Context) error {
				if err := in.KeepAlive(ctx); err != nil && !errors.Is(err, spate.ErrSessionExpired) {
					return err
				}
				return nil
			}}
		})},
	{name: "session-close-leaves-keys", breaks: []string{"SessionCloseDeletesItsKeys"},
		wrap: withSessions(func(_ *shared, _ *mem.Store, in spate.Session) spate.Session {
			return &hookedSession{Session: in, close: func() error { return nil }}
		})},
	{name: "session-outlives-store", breaks: []string{"SessionArgumentsAndStoreClose"},
		wrap: func(sh *shared, s *mem.Store) spate.Store {
			sib := sh.sibling(s)
			return &sessioning{hooked: &hooked{Store: s}, ns: sib.NewSession}
		}},
}

// sessionRuleNames are the rules of the Sessioner capability.
var sessionRuleNames = []string{"SessionerIsReported", "SessionKeysLiveWhileKeptAlive", "KeepAliveWritesNothing",
	"SessionCreateAndUpdateAreFenced", "StoreUpdateUnbinds", "ExpiredSessionFails", "SessionCloseDeletesItsKeys",
	"SessionArgumentsAndStoreClose"}

// withoutSessions is mem without reporting the Sessioner capability.
type withoutSessions struct{ *mem.Store }

func (w withoutSessions) Capabilities() spate.Capabilities {
	c := w.Store.Capabilities()
	c.Sessions = false
	return c
}

// A store without the capability skips its rules, visibly: each comes back
// Skipped, with the reason in its log.
func TestSessionRulesSkipWithoutTheCapability(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var (
			mu      sync.Mutex
			results = map[string]conformance.Result{}
		)
		sel := func(rule string) bool {
			_, name, _ := strings.Cut(rule, "/")
			return slices.Contains(sessionRuleNames, name)
		}
		mk := func(testing.TB) conformance.Harness {
			return &harness{root: mem.MustNew(mem.Options{TTL: ttl}), wrap: func(s *mem.Store) spate.Store { return withoutSessions{s} }}
		}
		err := conformance.CheckStore(t.Context(), mk, conformance.Select(sel),
			conformance.OnResult(func(r conformance.Result) {
				mu.Lock()
				defer mu.Unlock()
				results[r.Rule] = r
			}))
		require.NoError(t, err)
		n := 0
		for _, r := range conformance.StoreRules {
			if !sel("Store/" + r.Name) {
				continue
			}
			n++
			res := results["Store/"+r.Name]
			assert.Equal(t, conformance.Skipped, res.Status, "%s: %v", r.Name, res.Log)
			assert.Contains(t, strings.Join(res.Log, "\n"), "does not have the optional spate.Sessioner capability", r.Name)
		}
		assert.Equal(t, 8, n, "the Sessioner rules")
	})
}
