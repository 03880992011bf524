package spate_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/spate-go/spate"
)

func TestSplitIDValidation(t *testing.T) {
	for _, ok := range []string{"rows-000000-000125", "A_z9", "x", strings.Repeat("x", spate.SplitIDMaxLen)} {
		id, err := spate.NewSplitID(ok)
		if err != nil {
			t.Errorf("NewSplitID(%q): %v", ok, err)
		}
		if id.String() != ok {
			t.Errorf("NewSplitID(%q).String() = %q", ok, id)
		}
	}
	for _, bad := range []string{"", "a.b", "a b", "a/b", "å", "a\x00", strings.Repeat("x", spate.SplitIDMaxLen+1)} {
		_, err := spate.NewSplitID(bad)
		if err == nil {
			t.Errorf("NewSplitID(%q) accepted an invalid id", bad)
			continue
		}
		if spate.KindOf(err) != spate.KindFatal || !errors.Is(err, spate.ErrFatal) {
			t.Errorf("NewSplitID(%q): error %v is %v, want Fatal", bad, err, spate.KindOf(err))
		}
	}
	var zero spate.SplitID
	if !zero.IsZero() {
		t.Error("zero SplitID should report IsZero")
	}
}

func TestSplitIDText(t *testing.T) {
	var id spate.SplitID
	if err := id.UnmarshalText([]byte("good-id")); err != nil || id.String() != "good-id" {
		t.Fatalf("UnmarshalText: %v %q", err, id)
	}
	if err := id.UnmarshalText([]byte("bad.id")); !spate.IsFatal(err) {
		t.Fatalf("UnmarshalText of an invalid id: %v", err)
	}
	if id.String() != "good-id" {
		t.Fatalf("a failed UnmarshalText changed the id to %q", id)
	}
}

func TestErrorKindsMapToTheFrameworkTaxonomy(t *testing.T) {
	fenced := spate.Fencedf("split %s is owned by a peer at epoch %d", "s-0", 2)
	if spate.ClassOf(fenced) != spate.ClassFatal {
		t.Errorf("Fenced maps to %v, want Fatal (the unintercepted backstop)", spate.ClassOf(fenced))
	}
	if !errors.Is(fenced, spate.ErrFenced) || errors.Is(fenced, spate.ErrFatal) {
		t.Errorf("a fenced error matches ErrFenced only")
	}
	if !strings.Contains(fenced.Error(), "owned by a peer") {
		t.Errorf("error text lost the reason: %q", fenced)
	}
	if c := spate.ClassOf(spate.Retryablef("timeout")); c != spate.ClassRetryable {
		t.Errorf("Retryable maps to %v", c)
	}
	if c := spate.ClassOf(spate.Fatalf("no CAS")); c != spate.ClassFatal {
		t.Errorf("Fatal maps to %v", c)
	}
	cases := []struct {
		err  error
		want spate.ErrorKind
	}{
		{nil, spate.KindNone},
		{fmt.Errorf("etcd: put %q: %w: %w", "k", errors.New("io"), spate.ErrRetryable), spate.KindRetryable},
		{fmt.Errorf("nats: %w: %w", errors.New("bad creds"), spate.ErrFatal), spate.KindFatal},
		{fmt.Errorf("wrapped: %w", spate.Fencedf("x")), spate.KindFenced},
		{context.Canceled, spate.KindRetryable},
		{fmt.Errorf("op: %w", context.DeadlineExceeded), spate.KindRetryable},
		{errors.New("unclassified"), spate.KindFatal},
		{spate.ClosedError("mem"), spate.KindFatal},
	}
	for _, c := range cases {
		if got := spate.KindOf(c.err); got != c.want {
			t.Errorf("KindOf(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	wrapped := spate.Retryablef("store unreachable: %w", context.DeadlineExceeded)
	if !errors.Is(wrapped, context.DeadlineExceeded) || !errors.Is(wrapped, spate.ErrRetryable) {
		t.Errorf("a %%w cause must stay reachable: %v", wrapped)
	}
}

func TestBuildersCoverTheSeamTypes(t *testing.T) {
	spec := spate.NewSplitSpec(spate.MustSplitID("s"), []byte("d"))
	if spec.Weight != 1 {
		t.Errorf("default weight %d, want 1", spec.Weight)
	}
	if w := spec.WithWeight(64 << 20).Weight; w != 64<<20 {
		t.Errorf("WithWeight: %d", w)
	}
	if w := spec.WithWeight(0).EffectiveWeight(); w != 1 {
		t.Errorf("weight 0 is treated as 1, got %d", w)
	}
	planned := spate.NewPlannedSplit(spec)
	if planned.Seed != nil {
		t.Error("NewPlannedSplit has no seed")
	}
	seeded := planned.WithSeed(spate.NewSplitProgress(7, []byte("state")))
	if seeded.Seed == nil || seeded.Seed.Watermark != 7 || planned.Seed != nil {
		t.Errorf("WithSeed: %+v (original %+v)", seeded.Seed, planned.Seed)
	}
	plan := spate.NewSplitPlan([]spate.PlannedSplit{seeded}, spate.PlanOpen)
	if plan.PlannerState != nil {
		t.Error("NewSplitPlan keeps the previous cursor (nil)")
	}
	if st := plan.WithPlannerState([]byte("cursor")).PlannerState; string(st) != "cursor" {
		t.Errorf("WithPlannerState: %q", st)
	}
	if st := plan.WithPlannerState(nil).PlannerState; st == nil {
		t.Error("WithPlannerState(nil) must store an empty cursor, not keep the old one")
	}
	if spate.NewSplitProgress(7, nil).Completed || !spate.CompletedProgress(7, nil).Completed {
		t.Error("progress builders set Completed wrongly")
	}
	if spate.PlanOpen.String() != "open" || spate.PlanFinal.String() != "final" {
		t.Error("finality names")
	}
}

func TestLeaseEpochsOrderAcrossOwners(t *testing.T) {
	if !(spate.LeaseEpoch(2) > spate.LeaseEpoch(1)) {
		t.Fatal("epochs must order")
	}
}

func TestWakerCoalescesAndNeverBlocks(t *testing.T) {
	w := spate.NewWaker()
	for range 100 {
		w.Wake() // must not block even though nobody receives
	}
	select {
	case <-w.C():
	default:
		t.Fatal("a wake must be buffered")
	}
	select {
	case <-w.C():
		t.Fatal("a burst must coalesce into one wakeup")
	default:
	}
	inert := spate.InertWaker()
	inert.Wake()
	var zero spate.Waker
	zero.Wake()
	if inert.C() != nil {
		t.Fatal("an inert waker has no channel")
	}
}

func TestSeamDefaults(t *testing.T) {
	c := &minimal{}
	id := spate.MustSplitID("s-0")
	if err := spate.ReleaseDrained(context.Background(), c, id); err != nil || c.released != 1 {
		t.Fatalf("ReleaseDrained falls back to Release: err=%v released=%d", err, c.released)
	}
	if err := spate.DeclineRevoke(context.Background(), c, id); err != nil {
		t.Fatalf("DeclineRevoke defaults to a no-op: %v", err)
	}
}

// minimal implements only the required methods.
type minimal struct{ released int }

func (m *minimal) SetWaker(spate.Waker)                              {}
func (m *minimal) Start(spate.SplitPlanner) error                    { return nil }
func (m *minimal) Poll() ([]spate.Event, error)                      { return nil, nil }
func (m *minimal) Close() error                                      { return nil }
func (m *minimal) Fail(context.Context, spate.SplitID, string) error { return nil }
func (m *minimal) Commit(_ context.Context, id spate.SplitID, _ spate.SplitProgress) error {
	return spate.Fencedf("split %s is owned by a peer", id)
}
func (m *minimal) Release(_ context.Context, ids ...spate.SplitID) error {
	m.released += len(ids)
	return nil
}

func TestValidateKey(t *testing.T) {
	for _, ok := range []string{"plan", "split.abc-1", "_probe.x", "a.b.c"} {
		if err := spate.ValidateKey(ok); err != nil {
			t.Errorf("ValidateKey(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".a", "a.", "a..b", "a b", "a/b", "a*", strings.Repeat("k", spate.KeyMaxLen+1)} {
		if err := spate.ValidateKey(bad); !errors.Is(err, spate.ErrInvalidKey) || !spate.IsFatal(err) {
			t.Errorf("ValidateKey(%q) = %v", bad, err)
		}
	}
	for _, ok := range []string{"", "split.", "spl"} {
		if err := spate.ValidatePrefix(ok); err != nil {
			t.Errorf("ValidatePrefix(%q): %v", ok, err)
		}
	}
}

func TestCheckCall(t *testing.T) {
	ctx := context.Background()
	if err := spate.CheckCall(ctx, "drv", "get", spate.Durable, "plan", false); err != nil {
		t.Fatalf("valid call: %v", err)
	}
	if err := spate.CheckCall(ctx, "drv", "list", spate.Ephemeral, "split.", true); err != nil {
		t.Fatalf("valid prefix: %v", err)
	}
	for name, err := range map[string]error{
		"keyspace":     spate.CheckCall(ctx, "drv", "get", spate.Keyspace(9), "plan", false),
		"key":          spate.CheckCall(ctx, "drv", "get", spate.Durable, "a..b", false),
		"trailing dot": spate.CheckCall(ctx, "drv", "get", spate.Durable, "split.", false),
	} {
		if !spate.IsFatal(err) || !strings.HasPrefix(err.Error(), "drv: get: ") {
			t.Errorf("%s: %v, want a Fatal error naming driver and op", name, err)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	err := spate.CheckCall(cctx, "drv", "put", spate.Durable, "plan", false)
	if !spate.IsRetryable(err) || !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v, want Retryable wrapping context.Canceled", err)
	}
}
