package blobsink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"gocloud.dev/blob"
	"gocloud.dev/blob/fileblob"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/s3test"
	"github.com/spate-go/spate/pipeline"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

var split = spate.MustSplitID("s1")

// backends runs f against a local directory (fileblob) and the S3 wire
// protocol (gofakes3 through s3blob).
func backends(t *testing.T, f func(t *testing.T, b *blob.Bucket)) {
	t.Run("fileblob", func(t *testing.T) {
		b, err := fileblob.OpenBucket(t.TempDir(), nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Close() })
		f(t, b)
	})
	t.Run("s3", func(t *testing.T) {
		srv := s3test.Start(t)
		f(t, s3test.Open(t, srv.Bucket(t, "out", "")))
	})
}

func newSink(t *testing.T, b *blob.Bucket) *Sink {
	t.Helper()
	s, err := New(context.Background(), b, "test://out/", "job")
	require.NoError(t, err)
	s.RollSize = 1 // every commit cuts a part, unless a test says otherwise
	return s
}

func records(p pipeline.PartitionID, from, to int64) []pipeline.Record {
	var out []pipeline.Record
	for i := from; i < to; i++ {
		out = append(out, pipeline.Record{Key: []byte("k"), Value: []byte(fmt.Sprint(i)), Partition: p, Offset: i})
	}
	return out
}

func lines(from, to int64) string {
	var b strings.Builder
	for i := from; i < to; i++ {
		fmt.Fprintf(&b, "k\t%d\n", i)
	}
	return b.String()
}

func open(t *testing.T, s *Sink, epoch uint64, p pipeline.PartitionID, committed []byte) {
	t.Helper()
	require.NoError(t, s.OpenStage(context.Background(), pipeline.StageTenancy{Split: split, Epoch: spate.LeaseEpoch(epoch), Partition: p}, committed))
}

func write(t *testing.T, s *Sink, p pipeline.PartitionID, from, to int64) {
	t.Helper()
	require.NoError(t, s.Write(context.Background(), 0, records(p, from, to)))
}

func prepare(t *testing.T, s *Sink, p pipeline.PartitionID, w int64, final bool) ([]byte, int64) {
	t.Helper()
	c, covered, _, err := s.Prepare(context.Background(), p, w, final)
	require.NoError(t, err)
	return c, covered
}

// published reads the split's parts in name order, and lists every key
// outside .spate/.
func published(t *testing.T, b *blob.Bucket) (string, []string) {
	t.Helper()
	var out strings.Builder
	var keys []string
	it := b.List(&blob.ListOptions{})
	for {
		obj, err := it.Next(context.Background())
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if strings.HasPrefix(obj.Key, ".spate/") {
			continue
		}
		keys = append(keys, obj.Key)
		data, err := b.ReadAll(context.Background(), obj.Key)
		require.NoError(t, err)
		out.Write(data)
	}
	return out.String(), keys
}

func TestPublishesOnlyWhatACommitLists(t *testing.T) {
	backends(t, func(t *testing.T, b *blob.Bucket) {
		s := newSink(t, b)
		open(t, s, 1, 0, nil)
		write(t, s, 0, 0, 10)
		c, covered := prepare(t, s, 0, 5, false)
		require.Equal(t, int64(5), covered)
		got, _ := published(t, b)
		require.Empty(t, got, "a prepared part is staged, not visible")
		require.NoError(t, s.Publish(context.Background(), 0, c))
		require.NoError(t, s.Publish(context.Background(), 0, c), "publishing again is a no-op")
		got, keys := published(t, b)
		require.Equal(t, lines(0, 5), got)
		require.Equal(t, []string{"s1/00000000.out"}, keys)
		c, _ = prepare(t, s, 0, 10, false)
		require.NoError(t, s.Publish(context.Background(), 0, c))
		got, keys = published(t, b)
		require.Equal(t, lines(0, 10), got)
		require.Equal(t, []string{"s1/00000000.out", "s1/00000001.out"}, keys)
	})
}

// Parts are cut by size, by age and when final; a commit that cuts none
// covers only what the parts cut before cover.
func TestPartsRollBySizeAgeAndFinal(t *testing.T) {
	backends(t, func(t *testing.T, b *blob.Bucket) {
		s := newSink(t, b)
		now := time.Unix(1000, 0)
		s.now = func() time.Time { return now }
		s.RollSize, s.RollInterval = int64(len(lines(0, 20))), time.Minute
		open(t, s, 1, 0, nil)
		write(t, s, 0, 0, 10)
		_, covered := prepare(t, s, 0, 10, false)
		require.Zero(t, covered, "10 lines are below the roll size and young: no part")
		now = now.Add(time.Minute)
		c, covered := prepare(t, s, 0, 10, false)
		require.Equal(t, int64(10), covered, "the oldest staged line is a roll interval old")
		require.NoError(t, s.Publish(context.Background(), 0, c))
		write(t, s, 0, 10, 40)
		c, covered = prepare(t, s, 0, 30, false)
		require.Equal(t, int64(30), covered, "20 lines reach the roll size")
		require.NoError(t, s.Publish(context.Background(), 0, c))
		_, covered = prepare(t, s, 0, 35, false)
		require.Equal(t, int64(30), covered)
		c, covered = prepare(t, s, 0, 35, true)
		require.Equal(t, int64(35), covered, "final covers the watermark")
		require.NoError(t, s.Publish(context.Background(), 0, c))
		got, keys := published(t, b)
		require.Equal(t, lines(0, 35), got)
		require.Len(t, keys, 3)
	})
}

// A takeover publishes what the committed record lists and nothing else:
// the old owner's part listed by its last won commit (it froze before
// publishing) becomes visible once, its later staged part never, and the
// zombie's late publish changes nothing (and succeeds: the part it would
// copy is there with the committed bytes).
func TestTakeoverPublishesTheListedPartsAndAZombieNothing(t *testing.T) {
	backends(t, func(t *testing.T, b *blob.Bucket) {
		a := newSink(t, b)
		open(t, a, 1, 0, nil)
		write(t, a, 0, 0, 4)
		c, _ := prepare(t, a, 0, 4, false)
		require.NoError(t, a.Publish(context.Background(), 0, c))
		write(t, a, 0, 4, 8)
		won, _ := prepare(t, a, 0, 8, false) // its commit wins; A freezes before publishing
		write(t, a, 0, 8, 12)
		_, _ = prepare(t, a, 0, 12, false) // its commit is fenced: never listed

		nb := newSink(t, b)
		open(t, nb, 2, 7, won)
		got, _ := published(t, b)
		require.Equal(t, lines(0, 8), got, "the new owner publishes what the record lists, first")

		require.NoError(t, a.Publish(context.Background(), 0, won), "the zombie's staged objects are gone, but the part is published with the committed bytes: done, not damage")
		got, _ = published(t, b)
		require.Equal(t, lines(0, 8), got, "a zombie's late publish changes nothing")

		write(t, nb, 7, 8, 12)
		c, _ = prepare(t, nb, 7, 12, false)
		require.NoError(t, nb.Publish(context.Background(), 7, c))
		got, keys := published(t, b)
		require.Equal(t, lines(0, 12), got)
		require.Len(t, keys, 3)

		// The record of B's last commit (listing its part 2 as pending)
		// opens again cleanly: a republished part is skipped.
		open(t, newSink(t, b), 3, 9, c)
		got, _ = published(t, b)
		require.Equal(t, lines(0, 12), got)
	})
}

// Damage gets an error naming the object and the fix, and leaves the
// published parts as they were.
func TestDamage(t *testing.T) {
	ctx := context.Background()
	// committed runs tenancy 1 to two published parts and one part listed
	// but not published, and returns the last committable.
	committed := func(t *testing.T, b *blob.Bucket) []byte {
		s := newSink(t, b)
		open(t, s, 1, 0, nil)
		write(t, s, 0, 0, 4)
		c, _ := prepare(t, s, 0, 4, false)
		require.NoError(t, s.Publish(ctx, 0, c))
		write(t, s, 0, 4, 8)
		c, _ = prepare(t, s, 0, 8, false)
		require.NoError(t, s.Publish(ctx, 0, c))
		write(t, s, 0, 8, 12)
		c, _ = prepare(t, s, 0, 12, false)
		return c
	}
	cases := []struct {
		name   string
		damage func(t *testing.T, b *blob.Bucket, c []byte) []byte
		want   string
	}{
		{"a published part deleted", func(t *testing.T, b *blob.Bucket, c []byte) []byte {
			require.NoError(t, b.Delete(ctx, "s1/00000000.out"))
			return c
		}, "a part was deleted, truncated or replaced"},
		{"a published part truncated", func(t *testing.T, b *blob.Bucket, c []byte) []byte {
			require.NoError(t, b.WriteAll(ctx, "s1/00000001.out", []byte("k\t4\n"), nil))
			return c
		}, "a part was deleted, truncated or replaced"},
		{"an object no commit lists", func(t *testing.T, b *blob.Bucket, c []byte) []byte {
			require.NoError(t, b.WriteAll(ctx, "s1/00000007.out", []byte("stray\n"), nil))
			return c
		}, "s1/00000007.out is not one of its 3 committed parts"},
		{"a listed staged object deleted", func(t *testing.T, b *blob.Bucket, c []byte) []byte {
			require.NoError(t, b.Delete(ctx, ".spate/stage/s1/1/00000002"))
			return c
		}, "is gone before it was published"},
		{"a listed staged object altered", func(t *testing.T, b *blob.Bucket, c []byte) []byte {
			require.NoError(t, b.WriteAll(ctx, ".spate/stage/s1/1/00000002", []byte("k\t8\nk\t9\nk\t1\nk\t11\n"), nil))
			return c
		}, "it was altered"},
		{"output present without a commit", func(t *testing.T, b *blob.Bucket, c []byte) []byte {
			return nil
		}, "has no committed output, but"},
		{"an alien committable", func(t *testing.T, b *blob.Bucket, c []byte) []byte {
			return []byte(`{"v":1,"file":"s1.out","len":3}`)
		}, "committable"},
		{"a committable naming a key outside the staging area", func(t *testing.T, b *blob.Bucket, c []byte) []byte {
			return []byte(`{"v":1,"parts":1,"bytes":3,"pending":[{"i":0,"s":"elsewhere/x","n":3,"c":0}]}`)
		}, "outside the staging area"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			backends(t, func(t *testing.T, b *blob.Bucket) {
				c := committed(t, b)
				before, _ := published(t, b)
				c = tc.damage(t, b, c)
				after, _ := published(t, b)
				err := newSink(t, b).OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 2, Partition: 5}, c)
				require.ErrorContains(t, err, tc.want)
				if !strings.Contains(tc.name, "committable") {
					require.ErrorIs(t, err, pipeline.ErrOutputDamaged, "damage no retry can mend is marked so")
				}
				got, _ := published(t, b)
				require.Equal(t, after, got, "a refused open must not change the published parts (before the damage: %q)", before)
			})
		})
	}
	t.Run("two jobs on one destination", func(t *testing.T) {
		backends(t, func(t *testing.T, b *blob.Bucket) {
			_, err := New(ctx, b, "test://out/", "job")
			require.NoError(t, err)
			_, err = New(ctx, b, "test://out/", "job")
			require.NoError(t, err, "the same job opens its destination again")
			_, err = New(ctx, b, "test://out/", "other")
			require.ErrorContains(t, err, `holds the output of job "job"`)
		})
	})
}

// A completed split's staged objects go at once; RemoveStaging removes
// the rest (a zombie's).
func TestStagingIsRemoved(t *testing.T) {
	backends(t, func(t *testing.T, b *blob.Bucket) {
		ctx := context.Background()
		s := newSink(t, b)
		open(t, s, 1, 0, nil)
		write(t, s, 0, 0, 4)
		c, _ := prepare(t, s, 0, 4, true)
		require.NoError(t, s.Publish(ctx, 0, c))
		s.CloseStage(0, true)
		require.NoError(t, b.WriteAll(ctx, ".spate/stage/s9/4/00000000", []byte("zombie"), nil))
		require.NoError(t, RemoveStaging(ctx, b))
		it := b.List(&blob.ListOptions{Prefix: ".spate/stage/"})
		obj, err := it.Next(ctx)
		require.ErrorIs(t, err, io.EOF, "left: %+v", obj)
		got, _ := published(t, b)
		require.Equal(t, lines(0, 4), got)
	})
}

// Records of a partition with no stage are an error unless its tenancy
// ended (then they are dropped), and disordered records are refused.
func TestUnwiredAndDisorderedRecords(t *testing.T) {
	backends(t, func(t *testing.T, b *blob.Bucket) {
		s := newSink(t, b)
		err := s.Write(context.Background(), 0, records(3, 0, 1))
		require.ErrorIs(t, err, pipeline.ErrNoStage)
		open(t, s, 1, 0, nil)
		write(t, s, 0, 5, 6)
		require.ErrorIs(t, s.Write(context.Background(), 0, records(0, 2, 3)), spate.ErrFatal)
		s.CloseStage(0, false)
		require.NoError(t, s.Write(context.Background(), 0, records(0, 6, 7)), "a retired tenancy's late records are dropped")
	})
}
