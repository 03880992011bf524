package conformance_test

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/conformance"
	"github.com/spate-go/spate/driver"
	"github.com/spate-go/spate/stores/mem"
)

// capped gives a mutant's store a 64 KiB value cap.
func capped(o *mem.Options) { o.MaxValueSize = 64 << 10 }

// invalid reports whether key (a prefix if isPrefix) breaks the syntax.
func invalid(key string, isPrefix bool) bool {
	if isPrefix {
		return spate.ValidatePrefix(key) != nil
	}
	return spate.ValidateKey(key) != nil
}

// afterClose wraps a client whose Close is recorded in closed.
func afterClose(s *mem.Store, h *hooked, closed *atomic.Bool) *hooked {
	h.Store = s
	h.close = func() error {
		closed.Store(true)
		return s.Close()
	}
	return h
}

// argMutants break what a store reports, argument checks, error classes
// and Close.
var argMutants = []mutant{
	{name: "ignores-cancellation", breaks: []string{"CancelledContextIsRetryable"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, ctx: func(context.Context) context.Context { return context.Background() }}
		}},
	{name: "cancellation-unclassified", breaks: []string{"CancelledContextIsRetryable"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, pre: func(ctx context.Context, _ spate.Keyspace) error { return ctx.Err() }}
		}},
	{name: "cap-not-enforced", breaks: []string{"ValueSizeCap"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, caps: func(c spate.Capabilities) spate.Capabilities { c.MaxValueSize = 1024; return c }}
		}},
	{name: "cap-unreported", breaks: []string{"ValueCapIsReported"},
		harness: func() conformance.Harness {
			root := mem.MustNew(mem.Options{TTL: ttl, MaxValueSize: 64 << 10})
			return &harness{root: root, wrap: func(s *mem.Store) spate.Store {
				return &hooked{Store: s, caps: func(c spate.Capabilities) spate.Capabilities { c.MaxValueSize = 0; return c }}
			}}
		}},
	{name: "invalid-keys-accepted", breaks: []string{"InvalidKeysRejected"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, create: func(ctx context.Context, ks spate.Keyspace, key string, v []byte) (spate.Outcome, error) {
				if spate.ValidateKey(key) != nil {
					key = "inv-" + hex.EncodeToString([]byte(key))
					key = key[:min(len(key), spate.KeyMaxLen)]
				}
				return s.Create(ctx, ks, key, v)
			}}
		}},
	{name: "usable-after-close", breaks: []string{"UseAfterClose"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, close: func() error { return nil }}
		}},
	// A driver that found the server without persistence, reported it,
	// and is still passed.
	{name: "unmet-setting-reported", breaks: []string{"RequiredSettingsAreMet"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, caps: func(c spate.Capabilities) spate.Capabilities {
				c.UnmetSettings = []string{"appendonly yes (the server has appendonly no)"}
				return c
			}}
		}},
	{name: "driver-unnamed", breaks: []string{"DriverIsNamed"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, caps: func(c spate.Capabilities) spate.Capabilities { c.Driver = ""; return c }}
		}},

	// A driver reporting its lease's time left as the TTL.
	{name: "ttl-counts-down", breaks: []string{"TTLIsFixedWhenOpened"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			opened := time.Now()
			return &hooked{Store: s, caps: func(c spate.Capabilities) spate.Capabilities {
				c.TTL -= time.Since(opened) % c.TTL
				return c
			}}
		}},
	// A floor reported in the wrong unit.
	{name: "floor-above-ttl", breaks: []string{"TTLFloorIsAtMostTheTTL"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, caps: func(c spate.Capabilities) spate.Capabilities { c.TTLFloor = 1000 * c.TTL; return c }}
		}},
	// Capabilities asks the server every time.
	{name: "capabilities-ask-the-server", breaks: []string{"CapabilitiesNeverBlock"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, caps: func(c spate.Capabilities) spate.Capabilities { time.Sleep(5 * time.Millisecond); return c }}
		}},
	// A case-insensitive backend: keys that differ only in case collide.
	{name: "keys-case-folded", breaks: []string{"ValidKeysAreAccepted"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			l := strings.ToLower
			return &hooked{Store: s,
				create: func(ctx context.Context, ks spate.Keyspace, k string, v []byte) (spate.Outcome, error) {
					return s.Create(ctx, ks, l(k), v)
				},
				update: func(ctx context.Context, ks spate.Keyspace, k string, v []byte, exp uint64) (spate.Outcome, error) {
					return s.Update(ctx, ks, l(k), v, exp)
				},
				get: func(ctx context.Context, ks spate.Keyspace, k string) (spate.Entry, bool, error) {
					return s.Get(ctx, ks, l(k))
				},
				del: func(ctx context.Context, ks spate.Keyspace, k string, exp uint64) (spate.Outcome, error) {
					return s.Delete(ctx, ks, l(k), exp)
				},
				list: func(ctx context.Context, ks spate.Keyspace, p string) ([]spate.Entry, error) {
					return s.List(ctx, ks, l(p))
				},
				watch: func(ctx context.Context, ks spate.Keyspace, p string) (<-chan spate.WatchEvent, error) {
					return s.Watch(ctx, ks, l(p))
				}}
		}},
	// A NATS-style subject filter: a prefix matches whole segments only.
	{name: "prefix-by-segment", breaks: []string{"ValidPrefixesAreAccepted"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			seg := func(p string) string {
				if p != "" && !strings.HasSuffix(p, ".") {
					return p + "."
				}
				return p
			}
			return &hooked{Store: s,
				list: func(ctx context.Context, ks spate.Keyspace, p string) ([]spate.Entry, error) {
					return s.List(ctx, ks, seg(p))
				},
				watch: func(ctx context.Context, ks spate.Keyspace, p string) (<-chan spate.WatchEvent, error) {
					return s.Watch(ctx, ks, seg(p))
				}}
		}},
	{name: "get-accepts-invalid-keys", breaks: []string{"InvalidKeysRejected"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, get: func(ctx context.Context, ks spate.Keyspace, k string) (spate.Entry, bool, error) {
				if invalid(k, false) {
					return spate.Entry{}, false, nil // "no such key"
				}
				return s.Get(ctx, ks, k)
			}}
		}},
	{name: "update-accepts-invalid-keys", breaks: []string{"InvalidKeysRejected"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, update: func(ctx context.Context, ks spate.Keyspace, k string, v []byte, exp uint64) (spate.Outcome, error) {
				if invalid(k, false) {
					return spate.Outcome{}, nil // "no such key at that revision"
				}
				return s.Update(ctx, ks, k, v, exp)
			}}
		}},
	{name: "delete-accepts-invalid-keys", breaks: []string{"InvalidKeysRejected"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, del: func(ctx context.Context, ks spate.Keyspace, k string, exp uint64) (spate.Outcome, error) {
				if invalid(k, false) {
					return spate.Won(0), nil // "deleted nothing"
				}
				return s.Delete(ctx, ks, k, exp)
			}}
		}},
	{name: "list-accepts-invalid-prefixes", breaks: []string{"InvalidKeysRejected"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, list: func(ctx context.Context, ks spate.Keyspace, p string) ([]spate.Entry, error) {
				if invalid(p, true) {
					return nil, nil // "nothing matches"
				}
				return s.List(ctx, ks, p)
			}}
		}},
	{name: "watch-accepts-invalid-prefixes", breaks: []string{"InvalidKeysRejected"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, watch: func(ctx context.Context, ks spate.Keyspace, p string) (<-chan spate.WatchEvent, error) {
				if invalid(p, true) {
					return s.Watch(ctx, ks, "no.such.prefix.") // a watch on nothing
				}
				return s.Watch(ctx, ks, p)
			}}
		}},
	// An invalid key classified as a transport failure.
	{name: "invalid-key-retryable", breaks: []string{"InvalidKeysRejected"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, create: func(ctx context.Context, ks spate.Keyspace, k string, v []byte) (spate.Outcome, error) {
				if invalid(k, false) {
					return spate.Outcome{}, fmt.Errorf("mem: create %q: %w: %w", k, spate.ErrInvalidKey, spate.ErrRetryable)
				}
				return s.Create(ctx, ks, k, v)
			}}
		}},
	// A driver indexing its keyspaces with "ephemeral or else durable".
	{name: "invalid-keyspace-is-durable", breaks: []string{"InvalidKeyspacesAreFatal", "FatalWritesWriteNothing"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, ks: func(ks spate.Keyspace) spate.Keyspace {
				if ks != spate.Ephemeral {
					return spate.Durable
				}
				return ks
			}}
		}},
	{name: "keyspace-error-unclassified", breaks: []string{"ErrorsAreRetryableOrFatal", "InvalidKeyspacesAreFatal"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, pre: func(_ context.Context, ks spate.Keyspace) error {
				if ks != spate.Durable && ks != spate.Ephemeral {
					return errors.New("mem: no such keyspace")
				}
				return nil
			}}
		}},
	// A server's "request too large" mapped to a transport failure.
	{name: "oversized-create-retryable", breaks: []string{"ValueSizeCap"}, mem: capped,
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, create: func(ctx context.Context, ks spate.Keyspace, k string, v []byte) (spate.Outcome, error) {
				if len(v) > s.Capabilities().MaxValueSize {
					return spate.Outcome{}, fmt.Errorf("mem: create %q: request too large: %w", k, spate.ErrRetryable)
				}
				return s.Create(ctx, ks, k, v)
			}}
		}},
	{name: "oversized-update-unrefined", breaks: []string{"ValueSizeCap"}, mem: capped,
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, update: func(ctx context.Context, ks spate.Keyspace, k string, v []byte, exp uint64) (spate.Outcome, error) {
				if len(v) > s.Capabilities().MaxValueSize {
					return spate.Outcome{}, fmt.Errorf("mem: update %q: value too big: %w", k, spate.ErrFatal)
				}
				return s.Update(ctx, ks, k, v, exp)
			}}
		}},
	// A driver that writes what fits, then reports the value too large.
	{name: "oversized-update-lands-truncated", breaks: []string{"FatalWritesWriteNothing", "ValueSizeCap"}, mem: capped,
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, update: func(ctx context.Context, ks spate.Keyspace, k string, v []byte, exp uint64) (spate.Outcome, error) {
				if limit := s.Capabilities().MaxValueSize; len(v) > limit {
					_, _ = s.Update(ctx, ks, k, v[:limit], exp)
				}
				return s.Update(ctx, ks, k, v, exp)
			}}
		}},
	// Close marks the client closed only after in-flight writes (here: all
	// writes) were sent on its second connection.
	{name: "writes-land-after-close", breaks: []string{"FatalWritesWriteNothing"},
		wrap: func(sh *shared, s *mem.Store) spate.Store {
			sib := sh.sibling(s)
			var closed atomic.Bool
			return afterClose(s, &hooked{
				create: func(ctx context.Context, ks spate.Keyspace, k string, v []byte) (spate.Outcome, error) {
					o, err := sib.Create(ctx, ks, k, v)
					if closed.Load() {
						return spate.Outcome{}, driver.ClosedError("mem")
					}
					return o, err
				},
				update: func(ctx context.Context, ks spate.Keyspace, k string, v []byte, exp uint64) (spate.Outcome, error) {
					o, err := sib.Update(ctx, ks, k, v, exp)
					if closed.Load() {
						return spate.Outcome{}, driver.ClosedError("mem")
					}
					return o, err
				},
				del: func(ctx context.Context, ks spate.Keyspace, k string, exp uint64) (spate.Outcome, error) {
					o, err := sib.Delete(ctx, ks, k, exp)
					if closed.Load() {
						return spate.Outcome{}, driver.ClosedError("mem")
					}
					return o, err
				}}, &closed)
		}},
	{name: "closed-error-also-retryable", breaks: []string{"ErrorsAreRetryableOrFatal"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			var closed atomic.Bool
			return afterClose(s, &hooked{pre: func(context.Context, spate.Keyspace) error {
				if closed.Load() {
					return fmt.Errorf("%w: %w", driver.ClosedError("mem"), spate.ErrRetryable)
				}
				return nil
			}}, &closed)
		}},
	// A deadline reported by the server is read as a refused request.
	{name: "deadline-is-fatal", breaks: []string{"CancelledContextIsRetryable"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, pre: func(ctx context.Context, _ spate.Keyspace) error {
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					return fmt.Errorf("mem: deadline exceeded: %w: %w", ctx.Err(), spate.ErrFatal)
				}
				return nil
			}}
		}},
	{name: "context-cause-dropped", breaks: []string{"ErrorsKeepTheirCause"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, pre: func(ctx context.Context, _ spate.Keyspace) error {
				if ctx.Err() != nil {
					return fmt.Errorf("mem: call abandoned: %w", spate.ErrRetryable)
				}
				return nil
			}}
		}},
	// A failed transaction reported as an error.
	{name: "lost-update-is-an-error", breaks: []string{"LostConditionsAreOutcomes"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, update: func(ctx context.Context, ks spate.Keyspace, k string, v []byte, exp uint64) (spate.Outcome, error) {
				o, err := s.Update(ctx, ks, k, v, exp)
				if err == nil && !o.Won {
					return o, fmt.Errorf("mem: update %q: revision mismatch: %w", k, spate.ErrFatal)
				}
				return o, err
			}}
		}},
	{name: "guarded-delete-miss-is-an-error", breaks: []string{"LostConditionsAreOutcomes"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			return &hooked{Store: s, del: func(ctx context.Context, ks spate.Keyspace, k string, exp uint64) (spate.Outcome, error) {
				o, err := s.Delete(ctx, ks, k, exp)
				if err == nil && !o.Won {
					return o, fmt.Errorf("mem: delete %q: not found: %w", k, spate.ErrRetryable)
				}
				return o, err
			}}
		}},
	// Watches on a second connection Close does not know about.
	{name: "close-leaves-watches-open", breaks: []string{"CloseEndsEveryWatchAndIsIdempotent"},
		wrap: func(sh *shared, s *mem.Store) spate.Store {
			sib := sh.sibling(s)
			return &hooked{Store: s, watch: func(ctx context.Context, ks spate.Keyspace, p string) (<-chan spate.WatchEvent, error) {
				return sib.Watch(ctx, ks, p)
			}}
		}},
	{name: "close-not-idempotent", breaks: []string{"CloseEndsEveryWatchAndIsIdempotent"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			var closed atomic.Bool
			return &hooked{Store: s, close: func() error {
				if closed.Swap(true) {
					return errors.New("mem: already closed")
				}
				return s.Close()
			}}
		}},
	{name: "closed-error-not-fatal", breaks: []string{"UseAfterClose"},
		wrap: func(_ *shared, s *mem.Store) spate.Store {
			var closed atomic.Bool
			return afterClose(s, &hooked{pre: func(context.Context, spate.Keyspace) error {
				if closed.Load() {
					return fmt.Errorf("mem: %w", spate.ErrClosed)
				}
				return nil
			}}, &closed)
		}},
	// Close stops reads; writes go out on the second connection.
	{name: "writes-work-after-close", breaks: []string{"UseAfterClose"},
		wrap: func(sh *shared, s *mem.Store) spate.Store {
			sib := sh.sibling(s)
			var closed atomic.Bool
			pick := func() *mem.Store {
				if closed.Load() {
					return sib
				}
				return s
			}
			return afterClose(s, &hooked{
				create: func(ctx context.Context, ks spate.Keyspace, k string, v []byte) (spate.Outcome, error) {
					return pick().Create(ctx, ks, k, v)
				},
				update: func(ctx context.Context, ks spate.Keyspace, k string, v []byte, exp uint64) (spate.Outcome, error) {
					return pick().Update(ctx, ks, k, v, exp)
				},
				del: func(ctx context.Context, ks spate.Keyspace, k string, exp uint64) (spate.Outcome, error) {
					return pick().Delete(ctx, ks, k, exp)
				}}, &closed)
		}},
}
