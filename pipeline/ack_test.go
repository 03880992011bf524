package pipeline

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAckRefResolvesExactlyOnceOnLastRelease(t *testing.T) {
	cp := NewCheckpointer(nil)
	require.NoError(t, cp.BeginEpoch([]PartitionID{0}, 1))
	a := cp.Issuer().Issue(0, 9)
	a.Clone()
	a.Clone()
	a.Release()
	a.Release()
	_, err := cp.drain()
	require.NoError(t, err)
	got := cp.TakeWatermarks()
	require.Empty(t, got, "watermark advanced before the last release: %v", got)
	a.Release()
	_, err = cp.drain()
	require.NoError(t, err)
	got = cp.TakeWatermarks()
	require.Len(t, got, 1, "watermarks = %v, want [{0 10}]", got)
	require.Equal(t, int64(10), got[0].Offset, "watermarks = %v, want [{0 10}]", got)
	require.Zero(t, cp.Unresolved(), "unresolved = %d after the last release", cp.Unresolved())
	require.Panics(t, a.Release, "a release past the last reference must panic")
}

func TestAckRefAnyFailurePoisonsTheBatch(t *testing.T) {
	cp := NewCheckpointer(nil)
	_ = cp.BeginEpoch([]PartitionID{0}, 1)
	a := cp.Issuer().Issue(0, 4)
	a.Clone()
	a.Abandon() // one holder lost its data
	a.Release() // the other delivered
	_, _ = cp.drain()
	got := cp.TakeWatermarks()
	require.Empty(t, got, "a failed batch advanced the watermark: %v", got)
	st := cp.stalledPartitions()
	require.Len(t, st, 1, "stalled = %v, want partition 0", st)
}

func TestAckSetDefaultsToFailure(t *testing.T) {
	cp := NewCheckpointer(nil)
	_ = cp.BeginEpoch([]PartitionID{0, 1}, 1)
	is := cp.Issuer()
	a, b := is.Issue(0, 0), is.Issue(1, 0)
	var delivered, abandoned ackSet
	delivered.AddOnce(a)
	delivered.AddOnce(a) // once per chunk
	abandoned.AddOnce(b)
	require.Equal(t, 1, delivered.Len(), "AddOnce held a batch twice")
	var moved ackSet
	moved.Absorb(&delivered)
	require.Zero(t, delivered.Len(), "Absorb must move every reference")
	require.Equal(t, 1, moved.Len(), "Absorb must move every reference")
	a.Release()
	b.Release()
	moved.Deliver()
	abandoned.Abandon()
	_, _ = cp.drain()
	got := cp.TakeWatermarks()
	require.Len(t, got, 1, "watermarks = %v, want only partition 0", got)
	require.Equal(t, PartitionID(0), got[0].Partition, "watermarks = %v, want only partition 0", got)
	require.Zero(t, cp.Unresolved(), "unresolved = %d", cp.Unresolved())
}
