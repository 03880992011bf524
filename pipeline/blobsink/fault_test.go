package blobsink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gocloud.dev/blob"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline"
)

// newOwner starts a second worker over b: a fresh sink and coordination
// driver, holding nothing yet.
func newOwner(t *testing.T, b *blob.Bucket) *jobRun {
	t.Helper()
	r := &jobRun{t: t, coord: &driverCoord{}, sink: &countingSink{Sink: newSink(t, b)}}
	r.d = pipeline.NewCoordinationDriver(r.coord)
	cp := pipeline.NewCheckpointer(nil)
	r.d.Open(pipeline.SourceCtx{Issuer: cp.Issuer()})
	require.NoError(t, r.d.StageOutput(r.sink))
	_, err := r.d.Start(nil)
	require.NoError(t, err)
	return r
}

// takeOver has r gain split "a" at epoch 2, resuming from progress. Its
// stage opens on this poll, or later if the bucket fails.
func (r *jobRun) takeOver(progress spate.SplitProgress) {
	r.t.Helper()
	r.coord.mu.Lock()
	r.coord.queue = append(r.coord.queue, spate.Gained{Split: spate.NewSplitSpec(spate.MustSplitID("a"), []byte("a")), Epoch: 2, Progress: &progress})
	r.coord.mu.Unlock()
	r.poll()
}

// lanes reports whether the stage of split "a" is open, and notes its
// partition.
func (r *jobRun) lanes() bool {
	r.sink.mu.Lock()
	open := len(r.sink.stages) == 1
	r.sink.mu.Unlock()
	if as := r.d.Assignments(); open && len(as) == 1 {
		r.part = as[0].Partition
		return true
	}
	return false
}

// exactlyOnce requires the published output to hold lines 0..n-1 of
// records, each once, in order: it counts the lines lost and duplicated.
func exactlyOnce(t *testing.T, b *blob.Bucket, n int64) {
	t.Helper()
	got, keys := published(t, b)
	seen := map[string]int{}
	for l := range strings.Lines(got) {
		seen[l]++
	}
	var lost, dup int
	for i := range n {
		switch c := seen[fmt.Sprintf("k\t%d\n", i)]; {
		case c == 0:
			lost++
		case c > 1:
			dup += c - 1
		}
	}
	require.Zero(t, lost, "lines lost (parts %v)", keys)
	require.Zero(t, dup, "lines published twice (parts %v)", keys)
	require.Equal(t, lines(0, n), got, "the parts in order hold the output in order")
}

// A new owner whose stage cannot open because the bucket fails for a
// while (every request answered 503 SlowDown) keeps the split and tries
// again; once the bucket answers, it publishes what the committed record
// lists and goes on: the output is exactly once. The split is never set
// aside for a passing fault (it was: the sink's error was unmarked).
func TestTransientFaultAtOpenStageIsRetried(t *testing.T) {
	b, f := faultyBucket(t)
	r1 := startJob(t, b)
	r1.write(0, 4)
	r1.commit(4)
	r1.write(4, 8)
	f.failCopies.Store(true)
	r1.commit(8) // won; its publish fails: the committed record lists part 1 unpublished
	f.failCopies.Store(false)
	r1.coord.mu.Lock()
	committed := r1.coord.last
	r1.coord.mu.Unlock()
	require.Contains(t, string(committed.Output), `"pending"`, "the committed record lists an unpublished part")

	// r1 lost its lease (it is never polled again); r2 takes the split
	// over while the bucket fails every request.
	r2 := newOwner(t, b)
	f.failAll.Store(true)
	before := f.failed.Load()
	r2.takeOver(committed)
	require.Greater(t, f.failed.Load(), before, "the stage was tried while the bucket failed")
	r2.poll()
	fails, reasons := r2.failed()
	require.Empty(t, fails, "a passing fault of the bucket set the split aside: %v", reasons)
	require.False(t, r2.lanes(), "the stage opened while the bucket failed every request")

	f.failAll.Store(false)
	// The stage is retried after its back-off (at most 5 s).
	require.Eventually(t, func() bool { r2.poll(); return r2.lanes() }, time.Minute, 20*time.Millisecond,
		"the stage is tried again once the bucket answers")
	r2.write(8, 12)
	r2.commit(12)
	fails, reasons = r2.failed()
	require.Empty(t, fails, "%v", reasons)
	exactlyOnce(t, b, 12)
}

// A bucket that denies access is no fault that passes: the new owner sets
// the split aside at once, with a reason that says what to fix.
func TestDeniedBucketAtOpenStageSetsTheSplitAside(t *testing.T) {
	b, f := faultyBucket(t)
	r1 := startJob(t, b)
	r1.write(0, 4)
	r1.commit(4)
	r1.coord.mu.Lock()
	committed := r1.coord.last
	r1.coord.mu.Unlock()

	r2 := newOwner(t, b)
	f.denyAll.Store(true)
	r2.takeOver(committed)
	fails, reasons := r2.failed()
	require.Equal(t, []string{"a"}, fails, "the split is set aside, once")
	assert.Contains(t, reasons[0], "test://out/a/", "the reason names where")
	assert.Contains(t, reasons[0], "AccessDenied", "the reason holds the bucket's answer")
	assert.Contains(t, reasons[0], "access denied: give the credentials", "the reason says what to fix")
	assert.NotContains(t, reasons[0], "retryable")
	f.denyAll.Store(false)
	for range 3 {
		r2.poll()
	}
	fails, _ = r2.failed()
	require.Len(t, fails, 1, "a split set aside is not tried again by its owner")
	exactlyOnce(t, b, 4)
}

// fault marks what passes Retryable and what no retry mends Fatal.
func TestFaultKinds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	<-ctx.Done()
	for _, err := range []error{
		ctx.Err(),
		fmt.Errorf("put: %w", &net.OpError{Op: "dial", Err: errors.New("connection refused")}),
		httpStatus{503, "SlowDown"},
		httpStatus{500, "InternalError"},
		httpStatus{429, "TooManyRequests"},
	} {
		assert.True(t, spate.IsRetryable(fault(err)), "%v is a fault that passes", err)
		assert.ErrorIs(t, fault(err), err)
	}
	for _, err := range []error{httpStatus{403, "AccessDenied"}, httpStatus{400, "InvalidRequest"}} {
		assert.False(t, spate.IsRetryable(fault(err)), "%v is no fault that passes", err)
	}
}

// httpStatus is an error carrying an HTTP status and a service error code,
// as the S3 SDK's errors do.
type httpStatus struct {
	status int
	code   string
}

func (e httpStatus) Error() string       { return fmt.Sprintf("%d %s", e.status, e.code) }
func (e httpStatus) HTTPStatusCode() int { return e.status }
func (e httpStatus) ErrorCode() string   { return e.code }
