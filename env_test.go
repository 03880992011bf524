package spate

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// capableStore is a fake store that claims the optional capabilities, or
// implements them without claiming them (claim false).
type capableStore struct {
	*fakeStore
	claim bool
}

func (s *capableStore) Capabilities() Capabilities {
	c := s.fakeStore.Capabilities()
	c.UpdateAndDelete, c.WatchKeys = s.claim, s.claim
	return c
}

func (s *capableStore) UpdateAndDelete(context.Context, string, []byte, uint64, string, uint64) (Outcome, Outcome, error) {
	panic("not called")
}

func (s *capableStore) WatchKeys(context.Context, Keyspace, []string) (<-chan WatchEvent, error) {
	panic("not called")
}

// The actor's env holds the store with the capabilities it claims (a
// method set alone is not a claim), this worker's identity and the job's
// fingerprint; a store that cannot watch keys has every worker watch the
// whole job from the start.
func TestEnvHoldsTheStoreItsCapabilitiesAndTheIdentity(t *testing.T) {
	cfg := testConfig()
	for _, c := range []struct {
		name string
		st   Store
		caps bool
	}{
		{"plain", newFakeStore(), false},
		{"implements but does not claim", &capableStore{fakeStore: newFakeStore()}, false},
		{"claims", &capableStore{fakeStore: newFakeStore(), claim: true}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := newTestActor(t, c.st, cfg)
			assert.Same(t, a.c.store, a.st, "the store calls go to the coordinator's store")
			assert.Equal(t, c.caps, a.rel != nil, "Releaser")
			assert.Equal(t, c.caps, a.kw != nil, "KeyWatcher")
			assert.Equal(t, !c.caps, a.w.fullView, "a worker without KeyWatcher watches the whole job")
			assert.Equal(t, cfg.InstanceID, a.self)
			assert.Equal(t, "nonce-me", a.nonce)
			assert.Equal(t, testFP, a.fp)
			assert.Equal(t, fingerprintHash(testFP), a.fpHash)
			require.NotNil(t, a.renew)
			assert.Same(t, a.c.log, a.log)
			assert.Same(t, a.c.m, a.m)
		})
	}
}
