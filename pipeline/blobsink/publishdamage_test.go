package blobsink

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	"github.com/stretchr/testify/require"
	"gocloud.dev/blob"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/s3test"
	"github.com/spate-go/spate/pipeline"
)

// driverCoord is a minimal SplitCoordinator for driving a
// CoordinationDriver over a blob sink: Poll hands out queued events,
// commits always win (after beforeCommit, if set), Fail is recorded.
type driverCoord struct {
	mu           sync.Mutex
	waker        spate.Waker
	queue        []spate.Event
	commits      int
	last         spate.SplitProgress // the last progress committed
	fails        []string
	failReasons  []string
	beforeCommit func()
}

func (c *driverCoord) SetWaker(w spate.Waker)         { c.waker = w }
func (c *driverCoord) Start(spate.SplitPlanner) error { return nil }
func (c *driverCoord) Close() error                   { return nil }
func (c *driverCoord) Depart(context.Context) error   { return nil }

func (c *driverCoord) Poll() ([]spate.Event, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	evs := c.queue
	c.queue = nil
	return evs, nil
}

func (c *driverCoord) CommitAt(_ context.Context, _ spate.SplitID, _ spate.LeaseEpoch, p spate.SplitProgress) error {
	if c.beforeCommit != nil {
		c.beforeCommit()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.commits++
	c.last = p
	return nil
}

func (c *driverCoord) Fail(_ context.Context, s spate.SplitID, reason string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fails = append(c.fails, s.String())
	c.failReasons = append(c.failReasons, reason)
	return nil
}

func (c *driverCoord) Release(context.Context, ...spate.SplitID) error        { return nil }
func (c *driverCoord) ReleaseDrained(context.Context, ...spate.SplitID) error { return nil }
func (c *driverCoord) DeclineRevoke(context.Context, spate.SplitID) error     { return nil }

// idleLane emits nothing: the test writes the records to the sink itself.
type idleLane struct {
	id   pipeline.LaneID
	part pipeline.PartitionID
}

func (l idleLane) ID() pipeline.LaneID                              { return l.id }
func (l idleLane) Partition() pipeline.PartitionID                  { return l.part }
func (l idleLane) Poll(int, time.Duration) (*pipeline.Batch, error) { return nil, nil }

// driverSplits is a SplitSource whose splits never complete.
type driverSplits struct{}

func (driverSplits) OpenSplit(o pipeline.SplitOpening) (pipeline.Lane, error) {
	return idleLane{id: o.Lane, part: o.Partition}, nil
}
func (driverSplits) ValidateResume(spate.SplitSpec, spate.SplitProgress) error { return nil }
func (driverSplits) EncodeCommit(_ spate.SplitID, w int64) (spate.SplitProgress, error) {
	return spate.NewSplitProgress(w, nil), nil
}
func (driverSplits) Sweep(spate.SplitID) (*spate.SplitProgress, error) { return nil, nil }
func (driverSplits) CloseSplit(spate.SplitID)                          {}
func (driverSplits) TakeFinishing() []spate.SplitID                    { return nil }
func (driverSplits) BeginRevoke(spate.SplitID) bool                    { return true }

// countingSink counts the publishes of a blob sink.
type countingSink struct {
	*Sink
	publishes atomic.Int64
}

func (c *countingSink) Publish(ctx context.Context, p pipeline.PartitionID, committable []byte) error {
	c.publishes.Add(1)
	return c.Sink.Publish(ctx, p, committable)
}

// jobRun is a coordination driver over a blob sink holding split "a".
type jobRun struct {
	t     *testing.T
	coord *driverCoord
	sink  *countingSink
	d     *pipeline.CoordinationDriver[*driverCoord]
	part  pipeline.PartitionID
}

func startJob(t *testing.T, b *blob.Bucket) *jobRun {
	t.Helper()
	r := &jobRun{t: t, coord: &driverCoord{}, sink: &countingSink{Sink: newSink(t, b)}}
	r.d = pipeline.NewCoordinationDriver(r.coord)
	cp := pipeline.NewCheckpointer(nil)
	r.d.Open(pipeline.SourceCtx{Issuer: cp.Issuer()})
	require.NoError(t, r.d.StageOutput(r.sink))
	ev, err := r.d.Start(nil)
	require.NoError(t, err)
	require.Equal(t, "LanesAssigned", ev.Kind.String())
	r.coord.mu.Lock()
	r.coord.queue = append(r.coord.queue, spate.Gained{Split: spate.NewSplitSpec(spate.MustSplitID("a"), []byte("a")), Epoch: 1})
	r.coord.mu.Unlock()
	ev, err = r.d.PollEvents(driverSplits{}, 0)
	require.NoError(t, err)
	require.Equal(t, "LanesAdded", ev.Kind.String())
	as := r.d.Assignments()
	require.Len(t, as, 1)
	r.part = as[0].Partition
	return r
}

func (r *jobRun) write(from, to int64) {
	r.t.Helper()
	require.NoError(r.t, r.sink.Write(context.Background(), 0, records(r.part, from, to)))
}

func (r *jobRun) commit(w int64) {
	r.t.Helper()
	require.NoError(r.t, r.d.Commit(driverSplits{}, []pipeline.Watermark{{Partition: r.part, Offset: w}}))
}

func (r *jobRun) poll() {
	r.t.Helper()
	_, err := r.d.PollEvents(driverSplits{}, 0)
	require.NoError(r.t, err)
}

func (r *jobRun) failed() ([]string, []string) {
	r.coord.mu.Lock()
	defer r.coord.mu.Unlock()
	return append([]string(nil), r.coord.fails...), append([]string(nil), r.coord.failReasons...)
}

// What a publish needs, deleted while the job runs: the owner retried the
// publish on every poll, forever. No retry can bring it back, so the
// split is set aside: failed once through the coordinator, with a reason
// naming the object, and never published again.
func TestDriverSetsASplitWithDamagedBlobOutputAside(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		// damage runs while the second commit is won; it returns the key
		// the reason must name.
		damage func(t *testing.T, b *blob.Bucket) string
		want   string
	}{
		{"a published part deleted", func(t *testing.T, b *blob.Bucket) string {
			require.NoError(t, b.Delete(ctx, "a/00000000.out"))
			return "test://out/a/00000000.out"
		}, "a part was deleted, truncated or replaced"},
		{"a published part replaced", func(t *testing.T, b *blob.Bucket) string {
			require.NoError(t, b.WriteAll(ctx, "a/00000000.out", []byte("k\t0\n"), nil))
			return "test://out/a/"
		}, "a part was deleted, truncated or replaced"},
		{"the staged object to copy deleted", func(t *testing.T, b *blob.Bucket) string {
			require.NoError(t, b.Delete(ctx, ".spate/stage/a/1/00000001"))
			return "test://out/.spate/stage/a/1/00000001"
		}, "was deleted under the job before it was published"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			backends(t, func(t *testing.T, b *blob.Bucket) {
				r := startJob(t, b)
				r.write(0, 4)
				r.commit(4)
				got, _ := published(t, b)
				require.Equal(t, lines(0, 4), got)

				var key string
				r.coord.beforeCommit = func() { key = tc.damage(t, b) }
				r.write(4, 8)
				r.commit(8) // won; its publish finds the damage
				r.coord.beforeCommit = nil
				require.Equal(t, 2, r.coord.commits)
				after := r.sink.publishes.Load()
				for range 5 {
					r.poll()
					r.commit(8)
				}
				fails, reasons := r.failed()
				require.Equal(t, []string{"a"}, fails, "the split is failed once, through the coordinator")
				require.Contains(t, reasons[0], key)
				require.Contains(t, reasons[0], tc.want)
				require.Equal(t, after, r.sink.publishes.Load(), "publish retried after the damage was found")
				_, keys := published(t, b)
				require.NotContains(t, keys, "a/00000001.out", "the damaged split's later part was published")
			})
		})
	}
}

// faultyS3 is an in-process S3 server whose copies (or every request)
// fail with 503 SlowDown while told to: a store fault, not damage.
type faultyS3 struct {
	h          http.Handler
	failCopies atomic.Bool
	failAll    atomic.Bool
	denyAll    atomic.Bool // every request is denied (403 AccessDenied): no fault that passes
	failed     atomic.Int64
}

func (f *faultyS3) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.denyAll.Load() {
		f.failed.Add(1)
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusForbidden)
		_, _ = io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>injected denial</Message></Error>`)
		return
	}
	if f.failAll.Load() || f.failCopies.Load() && r.Header.Get("X-Amz-Copy-Source") != "" {
		f.failed.Add(1)
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>injected fault</Message></Error>`)
		return
	}
	f.h.ServeHTTP(w, r)
}

// A publish failing on a fault of the bucket is retried, the split is
// never set aside, and once the bucket answers the part is published once.
func TestTransientPublishFaultIsRetriedNotDamage(t *testing.T) {
	b, f := faultyBucket(t)

	r := startJob(t, b)
	r.write(0, 4)
	r.commit(4)
	r.write(4, 8)
	// Copies fail: the commit is won, its publish fails and is retried.
	// (Each failed request is retried by the SDK too, with its back-off.)
	f.failCopies.Store(true)
	r.commit(8)
	r.poll()
	r.commit(8)
	require.GreaterOrEqual(t, r.sink.publishes.Load(), int64(3), "the failed publish is retried")
	f.failCopies.Store(false)
	// Every request fails (the listing of the parts too).
	f.failAll.Store(true)
	before := r.sink.publishes.Load()
	r.poll()
	r.commit(8)
	require.Greater(t, r.sink.publishes.Load(), before, "the failed publish is retried")
	f.failAll.Store(false)
	require.Positive(t, f.failed.Load(), "no fault was injected")
	fails, reasons := r.failed()
	require.Empty(t, fails, "a fault of the bucket set the split aside: %v", reasons)

	r.poll()
	r.commit(8)
	got, keys := published(t, b)
	require.Equal(t, lines(0, 8), got, "once the bucket answers, the committed part is published")
	require.Equal(t, []string{"a/00000000.out", "a/00000001.out"}, keys)
	fails, _ = r.failed()
	require.Empty(t, fails)
}

// faultyBucket is a bucket "out" on an in-process S3 server that fails
// requests while told to.
func faultyBucket(t *testing.T) (*blob.Bucket, *faultyS3) {
	t.Helper()
	backend := s3mem.New()
	require.NoError(t, backend.CreateBucket("out"))
	f := &faultyS3{h: gofakes3.New(backend).Server()}
	ts := httptest.NewServer(f)
	t.Cleanup(ts.Close)
	q := url.Values{}
	q.Set("endpoint", ts.URL)
	q.Set("use_path_style", "true")
	q.Set("region", "us-east-1")
	q.Set("anonymous", "true")
	return s3test.Open(t, "s3://out?"+q.Encode()), f
}
