package pgsink_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/pgservers"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/pgsink"
	"github.com/spate-go/spate/pipeline/pgsource"
	_ "github.com/spate-go/spate/stores/mem"
	"github.com/spate-go/spate/storeurl"
)

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) != "" {
		os.Exit(runWorker()) // a worker process of the trial
	}
	os.Exit(pgservers.Main(m))
}

func newDB(t testing.TB) (string, *pgx.Conn) {
	t.Helper()
	url := pgservers.Shared(t).NewDB(t)
	c, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return url, c
}

func exec(t testing.TB, c *pgx.Conn, sql string) {
	t.Helper()
	_, err := c.Exec(context.Background(), sql)
	require.NoError(t, err, sql)
}

// audit counts, by key, the ids 1..n missing from table and the extra
// copies of the ones present, and rows with ids outside 1..n.
func audit(t testing.TB, c *pgx.Conn, table string, n int) (missing, dups, alien int) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, c.QueryRow(ctx, fmt.Sprintf(`SELECT
		(SELECT count(*) FROM generate_series(1, %[2]d) g WHERE NOT EXISTS (SELECT 1 FROM %[1]s d WHERE d.id = g)),
		(SELECT coalesce(sum(k - 1), 0) FROM (SELECT count(*) k FROM %[1]s GROUP BY id HAVING count(*) > 1) x),
		(SELECT count(*) FROM %[1]s WHERE id < 1 OR id > %[2]d)`, table, n)).Scan(&missing, &dups, &alien))
	return missing, dups, alien
}

// requireExactlyOnce requires table to hold each id 1..n once and nothing
// else; for each split given, its fence row to hold watermark n and the key
// of row n.
func requireExactlyOnce(t testing.TB, c *pgx.Conn, table string, n int, fenced ...spate.SplitID) {
	t.Helper()
	missing, dups, alien := audit(t, c, table, n)
	t.Logf("%d rows: %d missing, %d duplicates, %d alien", n, missing, dups, alien)
	require.Zero(t, missing, "missing")
	require.Zero(t, dups, "duplicates")
	require.Zero(t, alien, "alien")
	for _, split := range fenced {
		w, key := fenceRow(t, c, split.String())
		require.EqualValues(t, n, w, "the fence row's watermark")
		require.Equal(t, fmt.Sprint(n), key, "the fence row's key")
	}
}

func rows(p pipeline.PartitionID, from, to int) []pipeline.Record {
	var out []pipeline.Record
	for i := from; i < to; i++ {
		id := i + 1
		out = append(out, pipeline.Record{Key: fmt.Appendf(nil, "%d", id), Value: fmt.Appendf(nil, "%d\tv%d", id, id), Partition: p, Offset: int64(i)})
	}
	return out
}

func newSink(t testing.TB, url string, o pgsink.Options) *pgsink.Sink {
	t.Helper()
	o.URL = url
	if o.Table == "" {
		o.Table = "dst"
	}
	if o.Job == "" {
		o.Job = "job1"
	}
	s, err := pgsink.New(context.Background(), o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// A zombie (an owner whose lease moved on) flushes after the new owner took
// the fence: its transaction updates no fence row, rolls back, writes
// nothing and reports ErrFenced; the new owner resumes from the table's
// watermark. Into a table without a primary key: no duplicate, no missing
// row.
func TestZombieFlushWritesNothing(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, "CREATE TABLE dst (id int, v text)")
	ctx := context.Background()
	split := spate.MustSplitID("chunk-000000")
	old, cur := newSink(t, url, pgsink.Options{}), newSink(t, url, pgsink.Options{})

	require.NoError(t, old.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 1, Partition: 1}, nil))
	require.NoError(t, old.Write(ctx, 0, rows(1, 0, 60)))
	out, covered, pending, err := old.Prepare(ctx, 1, 50, false)
	require.NoError(t, err)
	require.EqualValues(t, 50, covered)
	require.False(t, pending)

	// The lease moves: the new owner takes the fence at epoch 2, resuming
	// from the committed 50.
	require.NoError(t, cur.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 2, Partition: 7}, out))
	// The zombie wakes and flushes what it staged since.
	require.NoError(t, old.Write(ctx, 0, rows(1, 60, 100)))
	_, _, _, err = old.Prepare(ctx, 1, 100, true)
	require.ErrorIs(t, err, spate.ErrFenced)
	require.ErrorContains(t, err, "a newer owner took the split")
	var n int
	require.NoError(t, c.QueryRow(ctx, "SELECT count(*) FROM dst").Scan(&n))
	require.Equal(t, 50, n, "the zombie's flush wrote nothing")

	require.NoError(t, cur.Write(ctx, 0, rows(7, 50, 100)))
	_, _, _, err = cur.Prepare(ctx, 7, 100, true)
	require.NoError(t, err)
	requireExactlyOnce(t, c, "dst", 100)

	// A zombie's tenancy opened late is refused too.
	err = old.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 1, Partition: 9}, out)
	require.ErrorIs(t, err, spate.ErrFenced)
}

// An owner that flushed and died before its commit reached the store
// leaves the table ahead of the job's committed watermark: the next owner
// drops the rows it reads again below the table's watermark, and refuses
// to go on if the row just below it is not the one the fence recorded.
func TestTableAheadOfTheStoreSkipsWhatItHolds(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, "CREATE TABLE dst (id int, v text)")
	ctx := context.Background()
	split := spate.MustSplitID("chunk-000000")
	a := newSink(t, url, pgsink.Options{})
	require.NoError(t, a.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 1, Partition: 1}, nil))
	require.NoError(t, a.Write(ctx, 0, rows(1, 0, 100)))
	committed, _, _, err := a.Prepare(ctx, 1, 40, false)
	require.NoError(t, err)
	_, _, _, err = a.Prepare(ctx, 1, 80, false) // flushed; the store commit is lost
	require.NoError(t, err)

	b := newSink(t, url, pgsink.Options{})
	require.NoError(t, b.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 2, Partition: 2}, committed))
	require.NoError(t, b.Write(ctx, 0, rows(2, 40, 100)))
	_, _, _, err = b.Prepare(ctx, 2, 100, true)
	require.NoError(t, err)
	missing, dups, _ := audit(t, c, "dst", 100)
	require.Zero(t, missing, "missing")
	require.Zero(t, dups, "duplicates")

	// The chunk changed under the job: the row below the table's watermark
	// is another one.
	exec(t, c, "TRUNCATE dst; DELETE FROM spate_fence")
	a = newSink(t, url, pgsink.Options{})
	require.NoError(t, a.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 1, Partition: 1}, nil))
	require.NoError(t, a.Write(ctx, 0, rows(1, 0, 100)))
	committed, _, _, err = a.Prepare(ctx, 1, 40, false)
	require.NoError(t, err)
	_, _, _, err = a.Prepare(ctx, 1, 80, false)
	require.NoError(t, err)
	c2 := newSink(t, url, pgsink.Options{})
	require.NoError(t, c2.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 2, Partition: 3}, committed))
	shifted := rows(3, 40, 100)
	shifted[39].Key = []byte("999") // offset 79 now holds another key
	err = c2.Write(ctx, 0, shifted)
	require.ErrorIs(t, err, spate.ErrFatal)
	require.ErrorContains(t, err, `table public.dst holds the split's rows up to the one with key "80", but the source now reads key "999" there`)
}

// Bad destinations are refused with an error naming the table and the fix.
func TestBadDestinationNamesTheTableAndTheFix(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, `CREATE TABLE dst (id int, v text);
		CREATE TABLE narrow (id int);
		CREATE TABLE typed (id int, v int);
		CREATE TABLE taken (id int, v text);`)
	ctx := context.Background()
	shape := []pgsource.Column{{Name: "id", Type: "integer"}, {Name: "v", Type: "text"}}
	cases := []struct {
		name string
		o    pgsink.Options
		want string
	}{
		{"missing table", pgsink.Options{Table: "nosuch"}, `destination table "nosuch" does not exist: create it`},
		{"missing column", pgsink.Options{Table: "narrow", Shape: shape}, `destination table public.narrow has no column "v", which the rows carry`},
		{"another type", pgsink.Options{Table: "typed", Shape: shape}, `destination table public.typed has column "v" of type integer, the source's is text`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.URL, tc.o.Job = url, "job1"
			_, err := pgsink.New(ctx, tc.o)
			require.ErrorContains(t, err, tc.want)
		})
	}
	t.Run("another job's fence rows", func(t *testing.T) {
		other := newSink(t, url, pgsink.Options{Table: "taken", Job: "other"})
		require.NoError(t, other.OpenStage(ctx, pipeline.StageTenancy{Split: spate.MustSplitID("s"), Epoch: 1, Partition: 1}, nil))
		_, err := pgsink.New(ctx, pgsink.Options{URL: url, Table: "taken", Job: "job1"})
		require.ErrorContains(t, err, `destination table public.taken already holds the output of job "other"`)
		require.ErrorContains(t, err, "DELETE FROM spate_fence WHERE job = 'other'")
	})
	t.Run("rows of another width", func(t *testing.T) {
		s := newSink(t, url, pgsink.Options{Table: "narrow"})
		require.NoError(t, s.OpenStage(ctx, pipeline.StageTenancy{Split: spate.MustSplitID("w"), Epoch: 1, Partition: 1}, nil))
		err := s.Write(ctx, 0, rows(1, 0, 3))
		require.ErrorIs(t, err, spate.ErrFatal)
		require.ErrorContains(t, err, "rows of 2 columns, and table public.narrow takes 1 (id)")
	})
	t.Run("rows of another type", func(t *testing.T) {
		s := newSink(t, url, pgsink.Options{Table: "typed"})
		require.NoError(t, s.OpenStage(ctx, pipeline.StageTenancy{Split: spate.MustSplitID("y"), Epoch: 1, Partition: 1}, nil))
		require.NoError(t, s.Write(ctx, 0, rows(1, 0, 3)))
		_, _, _, err := s.Prepare(ctx, 1, 3, true)
		require.ErrorIs(t, err, spate.ErrFatal)
		require.ErrorContains(t, err, "table public.typed refuses the rows")
		var n int
		require.NoError(t, c.QueryRow(ctx, "SELECT watermark FROM spate_fence WHERE split = 'y'").Scan(&n))
		require.Zero(t, n, "the fence did not move")
	})
}

// A destination emptied (TRUNCATE) after a run that did not complete,
// to copy again, still has the job's fence rows: a worker of the job
// would skip the rows they say the table holds, and they would be
// missing. The sink refuses the table, naming the fence rows and how to
// start over; with them deleted, the copy writes every row.
func TestEmptiedDestinationIsRefused(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, "CREATE TABLE dst (id int, v text)")
	ctx := context.Background()
	split := spate.MustSplitID("chunk-000000")
	s := newSink(t, url, pgsink.Options{})
	require.NoError(t, s.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 1, Partition: 1}, nil))
	require.NoError(t, s.Write(ctx, 0, rows(1, 0, 100)))
	_, _, _, err := s.Prepare(ctx, 1, 60, false) // the run stops here: 60 rows in, the job not complete
	require.NoError(t, err)
	exec(t, c, "TRUNCATE dst")

	_, err = pgsink.New(ctx, pgsink.Options{URL: url, Table: "dst", Job: "job1"})
	require.ErrorContains(t, err, `destination table public.dst is empty, but spate_fence says job "job1" wrote 60 rows into it (in 1 splits, by a run that did not complete) and it was emptied since`)
	require.ErrorContains(t, err, "DELETE FROM spate_fence WHERE job = 'job1'")

	exec(t, c, "DELETE FROM spate_fence WHERE job = 'job1'")
	again := newSink(t, url, pgsink.Options{})
	require.NoError(t, again.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 1, Partition: 1}, nil))
	require.NoError(t, again.Write(ctx, 0, rows(1, 0, 100)))
	_, _, _, err = again.Prepare(ctx, 1, 100, true)
	require.NoError(t, err)
	requireExactlyOnce(t, c, "dst", 100, split)
}

// copyJob copies table src into dst (no primary key) with workers
// pipeline workers over one mem store; stopOne stops one of them after a
// while (a graceful stop: its splits move to the others).
func copyJob(t testing.TB, url string, workers int, chunk int64, stopOne bool) {
	t.Helper()
	copyJobAt(t, url, workers, chunk, stopOne, 0)
}

// copyJobAt is copyJob with each worker held to rate rows a second (0:
// unlimited).
// sinkOpts are the sink's runtime options as `spate backfill` sets them:
// a batch lingers 5 ms, not the default second (the sink stages rows
// itself until the commit, so a long linger only delays them).
var sinkOpts = pipeline.SinkOptions{Linger: 5 * time.Millisecond}

func copyJobAt(t testing.TB, url string, workers int, chunk int64, stopOne bool, rate float64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dep, err := storeurl.Open(ctx, "mem://", storeurl.Options{})
	require.NoError(t, err)
	defer dep.Close()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var wg sync.WaitGroup
	errs := make([]error, workers)
	var rts []*pipeline.Runtime
	for range workers {
		st, err := dep.Open(ctx, "copy", 2*time.Second)
		require.NoError(t, err)
		defer st.Close()
		coord, err := spate.NewStoreCoordinator(st, spate.TimingsForLease(2*time.Second), spate.WithLogger(log))
		require.NoError(t, err)
		defer coord.Close()
		src, err := pgsource.New(ctx, pgsource.Options{URL: url, Table: "src", ChunkRows: chunk, PackRows: true})
		require.NoError(t, err)
		defer src.Close()
		sink, err := pgsink.New(ctx, pgsink.Options{URL: url, Table: "dst", Job: "copy", Shape: src.Table().Columns, Lease: 2 * time.Second})
		require.NoError(t, err)
		defer sink.Close()
		rt, err := pipeline.Build(pipeline.Config{Name: coord.InstanceID(), CommitInterval: 100 * time.Millisecond},
			pipeline.NewCoordinatedSource(coord, src, src), pace(rate),
			[]pipeline.SinkSpec{{Name: "pg", Sink: sink, Options: sinkOpts}}, pipeline.WithLogger(log))
		require.NoError(t, err)
		rts = append(rts, rt)
	}
	// The workers start together, as a user's processes started at once
	// would, not each as soon as it is built: an arrival after the first
	// split hand-out moves splits again.
	for i, rt := range rts {
		wctx := ctx
		if stopOne && i == 0 {
			var stop context.CancelFunc
			wctx, stop = context.WithCancel(ctx)
			time.AfterFunc(300*time.Millisecond, stop)
		}
		wg.Go(func() {
			rep, err := rt.Run(wctx)
			if err == nil {
				err = rep.Err()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
}

// A table copied by 3 workers, one of which stops midway, lands in a
// table without a primary key exactly once; the job's fence rows are
// cleaned up once it completed (the StageCleaner hook).
func TestCopyTableExactlyOnce(t *testing.T) {
	url, c := newDB(t)
	const n = 50000
	exec(t, c, fmt.Sprintf(`CREATE TABLE src (id int PRIMARY KEY, v text);
		INSERT INTO src SELECT i, 'v' || i FROM generate_series(1, %d) i;
		CREATE TABLE dst (id int, v text);`, n))
	copyJob(t, url, 3, 2000, true)
	requireExactlyOnce(t, c, "dst", n)
	var same bool
	require.NoError(t, c.QueryRow(context.Background(),
		"SELECT NOT EXISTS (SELECT id, v FROM src EXCEPT ALL SELECT id, v FROM dst)").Scan(&same))
	require.True(t, same, "every row's columns copied")
	var fences int
	require.NoError(t, c.QueryRow(context.Background(), "SELECT count(*) FROM spate_fence").Scan(&fences))
	require.Zero(t, fences, "the job's fence rows are cleaned up when it completes")
}

// fenceRow is the split's fence row: its watermark and last key.
func fenceRow(t testing.TB, c *pgx.Conn, split string) (int64, string) {
	t.Helper()
	var w int64
	var key *string
	require.NoError(t, c.QueryRow(context.Background(), "SELECT watermark, last_key FROM spate_fence WHERE split = $1", split).Scan(&w, &key))
	if key == nil {
		return w, ""
	}
	return w, *key
}

func count(t testing.TB, c *pgx.Conn, table string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, c.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

// A split's staged rows are bounded by FlushBytes: once they reach it,
// Write flushes them in a fenced transaction of their own, ahead of the
// commit, so the sink never holds more than FlushBytes and a row per
// split, however long the commits take. The next owner skips what such a
// flush wrote (checking the key at the table's watermark), so the table
// still holds each row once.
func TestStagedRowsAreBoundedByFlushBytes(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, "CREATE TABLE dst (id int, v text)")
	ctx := context.Background()
	split := spate.MustSplitID("chunk-000000")
	const flushBytes = 1024
	a := newSink(t, url, pgsink.Options{FlushBytes: flushBytes})
	require.NoError(t, a.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 1, Partition: 1}, nil))
	committed, _, _, err := a.Prepare(ctx, 1, 0, false)
	require.NoError(t, err)
	const n, rowBytes = 3000, len("1234\tv1234\n")
	for from := 0; from < n; from += 500 {
		require.NoError(t, a.Write(ctx, 0, rows(1, from, from+500)))
		// No commit came: all but the last FlushBytes (and a row) are in
		// the table already.
		staged := int64(from+500) - count(t, c, "dst")
		require.LessOrEqual(t, staged*int64(rowBytes), int64(flushBytes+rowBytes), "rows held in memory after %d written", from+500)
	}
	// One statement, one snapshot: a flush still running in the
	// background commits its rows and the fence together.
	var w, held int64
	var key string
	require.NoError(t, c.QueryRow(ctx, "SELECT watermark, last_key, (SELECT count(*) FROM dst) FROM spate_fence WHERE split = $1", split.String()).Scan(&w, &key, &held))
	require.Equal(t, held, w, "the fence row holds the table's watermark")
	require.Equal(t, fmt.Sprint(w), key, "and the key of the row below it")

	// The owner dies before any commit: the next resumes from 0, skips
	// what the table holds and writes the rest.
	b := newSink(t, url, pgsink.Options{FlushBytes: flushBytes})
	require.NoError(t, b.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 2, Partition: 2}, committed))
	require.NoError(t, b.Write(ctx, 0, rows(2, 0, n)))
	out, _, _, err := b.Prepare(ctx, 2, n, true)
	require.NoError(t, err)
	requireExactlyOnce(t, c, "dst", n)
	require.JSONEq(t, fmt.Sprintf(`{"epoch":2,"watermark":%d}`, n), string(out))

	// A commit at a watermark below what a flush already wrote records
	// the table's watermark too, and a fence row behind it is refused.
	exec(t, c, "TRUNCATE dst; DELETE FROM spate_fence")
	d := newSink(t, url, pgsink.Options{FlushBytes: flushBytes})
	require.NoError(t, d.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 1, Partition: 3}, nil))
	require.NoError(t, d.Write(ctx, 0, rows(3, 0, 200)))
	out, _, _, err = d.Prepare(ctx, 3, 10, false)
	require.NoError(t, err)
	w, _ = fenceRow(t, c, split.String())
	require.Greater(t, w, int64(10))
	require.JSONEq(t, fmt.Sprintf(`{"epoch":1,"watermark":10,"table":%d}`, w), string(out))
	exec(t, c, "UPDATE spate_fence SET watermark = 10")
	e := newSink(t, url, pgsink.Options{FlushBytes: flushBytes})
	err = e.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 2, Partition: 4}, out)
	require.ErrorContains(t, err, fmt.Sprintf("holds its rows up to 10, but the job committed up to %d: the fence row was deleted or the table restored", w))
}

// A write retried after its flush failed (a lost connection) stages
// nothing twice.
func TestRetriedWriteAfterAFailedFlushStagesNothingTwice(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, "CREATE TABLE dst (id int, v text)")
	ctx := context.Background()
	s := newSink(t, url, pgsink.Options{FlushBytes: 1024})
	require.NoError(t, s.OpenStage(ctx, pipeline.StageTenancy{Split: spate.MustSplitID("r"), Epoch: 1, Partition: 1}, nil))
	require.NoError(t, s.Write(ctx, 0, rows(1, 0, 300)))
	// The sink's pooled connections are cut: the next flush fails.
	exec(t, c, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'spate' AND pid <> pg_backend_pid()")
	batch := rows(1, 300, 600)
	require.Error(t, s.Write(ctx, 0, batch))
	retried(t, func() error { return s.Write(ctx, 0, batch) }) // the runtime's retry: the same records
	retried(t, func() error { _, _, _, err := s.Prepare(ctx, 1, 600, true); return err })
	missing, dups, _ := audit(t, c, "dst", 600)
	require.Zero(t, missing, "missing")
	require.Zero(t, dups, "duplicates")
}

// retried calls write as the runtime retries a failed write (the same
// records) or the controller a failed prepare, until it succeeds: each flush running in the background on a
// pooled connection the server cut fails once more, reported by the next
// write.
func retried(t *testing.T, write func() error) {
	t.Helper()
	for try := 1; ; try++ {
		err := write()
		if err == nil {
			return
		}
		require.Less(t, try, 10, "the write still fails: %v", err)
	}
}

// A row over the cap fails its batch, naming the table, the split, the
// row's key and the fix; nothing is written.
func TestRowOverTheCapWritesNothing(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, "CREATE TABLE dst (id int, v text)")
	ctx := context.Background()
	s := newSink(t, url, pgsink.Options{MaxRowBytes: 100, FlushBytes: 64})
	require.NoError(t, s.OpenStage(ctx, pipeline.StageTenancy{Split: spate.MustSplitID("wide"), Epoch: 1, Partition: 1}, nil))
	batch := rows(1, 0, 10)
	batch[7].Value = fmt.Appendf(nil, "8\t%0200d", 0)
	err := s.Write(ctx, 0, batch)
	require.ErrorIs(t, err, spate.ErrFatal)
	require.ErrorContains(t, err, `pgsink: split wide: table public.dst: the row with key "8" is 202 bytes, over the cap of 100 (MaxRowBytes); nothing of its batch was written: raise Options.MaxRowBytes`)
	require.Zero(t, count(t, c, "dst"), "nothing written")
	w, _ := fenceRow(t, c, "wide")
	require.Zero(t, w, "the fence did not move")
}

// Records that reach the sink after their tenancy ended (a split lost or
// handed back while its rows were queued) are dropped, not retried for
// ever: the next owner reads them again. A partition that never had a
// stage is a wiring error, fatal.
func TestRecordsOfAnEndedTenancyAreDropped(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, "CREATE TABLE dst (id int, v text)")
	ctx := context.Background()
	s := newSink(t, url, pgsink.Options{})
	require.NoError(t, s.OpenStage(ctx, pipeline.StageTenancy{Split: spate.MustSplitID("gone"), Epoch: 1, Partition: 1}, nil))
	s.CloseStage(1, false)
	require.NoError(t, s.Write(ctx, 0, rows(1, 0, 10)))
	err := s.Write(ctx, 0, rows(2, 0, 10))
	require.ErrorIs(t, err, pipeline.ErrNoStage)
	require.ErrorIs(t, err, spate.ErrFatal)
	require.Zero(t, count(t, c, "dst"))
}

// A write as the runtime's chunks, of two partitions, whose flush fails
// partway and which the runtime retries whole: every row lands once, and
// in each split's order.
func TestRetriedChunkedWriteStagesNothingTwice(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, "CREATE TABLE dst (id int, v text)")
	ctx := context.Background()
	s := newSink(t, url, pgsink.Options{FlushBytes: 1024})
	require.NoError(t, s.OpenStage(ctx, pipeline.StageTenancy{Split: spate.MustSplitID("a"), Epoch: 1, Partition: 1}, nil))
	require.NoError(t, s.OpenStage(ctx, pipeline.StageTenancy{Split: spate.MustSplitID("b"), Epoch: 1, Partition: 2}, nil))
	require.NoError(t, s.WriteChunks(ctx, 0, [][]pipeline.Record{rows(1, 0, 100), rows(2, 1000, 1100)}))
	exec(t, c, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'spate' AND pid <> pg_backend_pid()")
	chunks := [][]pipeline.Record{rows(1, 100, 300), rows(2, 1100, 1300), rows(1, 300, 400)}
	require.Error(t, s.WriteChunks(ctx, 0, chunks))
	retried(t, func() error { return s.WriteChunks(ctx, 0, chunks) }) // the runtime's retry: the same chunks
	// The controller prepares again at the next commit.
	retried(t, func() error { _, _, _, err := s.Prepare(ctx, 1, 400, true); return err })
	retried(t, func() error { _, _, _, err := s.Prepare(ctx, 2, 1300, true); return err })
	var n, dups, wrong int
	require.NoError(t, c.QueryRow(ctx, `SELECT count(*), count(*) - count(DISTINCT id),
		count(*) FILTER (WHERE NOT (id BETWEEN 1 AND 400 OR id BETWEEN 1001 AND 1300)) FROM dst`).Scan(&n, &dups, &wrong))
	require.Equal(t, 700, n, "rows")
	require.Zero(t, dups, "duplicates")
	require.Zero(t, wrong, "rows of neither split")
}

// pack packs records of one partition n at a time, as pgsource's
// PackRows does: lines and keys joined by '\n', the last row's offset.
func pack(records []pipeline.Record, n int) []pipeline.Record {
	var out []pipeline.Record
	for len(records) > 0 {
		k := min(n, len(records))
		var keys, values [][]byte
		for _, r := range records[:k] {
			keys, values = append(keys, r.Key), append(values, r.Value)
		}
		out = append(out, pipeline.Record{Key: bytes.Join(keys, []byte{'\n'}), Value: bytes.Join(values, []byte{'\n'}),
			Partition: records[0].Partition, Offset: records[k-1].Offset})
		records = records[k:]
	}
	return out
}

// Packed records (many rows a record) resume as single rows do: the rows
// of a record below the table's watermark are dropped, the rest written,
// and the key just below the watermark is checked inside a record too.
func TestPackedRecordsSkipWhatTheTableHolds(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, "CREATE TABLE dst (id int, v text)")
	ctx := context.Background()
	split := spate.MustSplitID("chunk-000000")
	ahead := func() []byte {
		a := newSink(t, url, pgsink.Options{}) // creates the fence table
		exec(t, c, "TRUNCATE dst; DELETE FROM spate_fence")
		require.NoError(t, a.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 1, Partition: 1}, nil))
		require.NoError(t, a.Write(ctx, 0, pack(rows(1, 0, 100), 10)))
		committed, _, _, err := a.Prepare(ctx, 1, 40, false)
		require.NoError(t, err)
		_, _, _, err = a.Prepare(ctx, 1, 80, false) // flushed; the store commit is lost
		require.NoError(t, err)
		return committed
	}
	committed := ahead()
	b := newSink(t, url, pgsink.Options{})
	require.NoError(t, b.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 2, Partition: 2}, committed))
	// Records of 7 rows from 40: rows 75..81 straddle the table's 80.
	require.NoError(t, b.Write(ctx, 0, pack(rows(2, 40, 100), 7)))
	_, _, _, err := b.Prepare(ctx, 2, 100, true)
	require.NoError(t, err)
	requireExactlyOnce(t, c, "dst", 100)
	var same bool
	require.NoError(t, c.QueryRow(ctx, "SELECT bool_and(v = 'v' || id) FROM dst").Scan(&same))
	require.True(t, same, "every row's columns copied")

	// The row below the table's watermark, inside a record, is another one.
	committed = ahead()
	c2 := newSink(t, url, pgsink.Options{})
	require.NoError(t, c2.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 2, Partition: 3}, committed))
	shifted := rows(3, 40, 100)
	shifted[39].Key = []byte("999") // offset 79 now holds another key
	err = c2.Write(ctx, 0, pack(shifted, 7))
	require.ErrorIs(t, err, spate.ErrFatal)
	require.ErrorContains(t, err, `table public.dst holds the split's rows up to the one with key "80", but the source now reads key "999" there`)

	// A commit inside a packed record is refused, with nothing written.
	exec(t, c, "TRUNCATE dst; DELETE FROM spate_fence")
	d := newSink(t, url, pgsink.Options{})
	require.NoError(t, d.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 1, Partition: 4}, nil))
	require.NoError(t, d.Write(ctx, 0, pack(rows(4, 0, 20), 10)))
	_, _, _, err = d.Prepare(ctx, 4, 15, false)
	require.ErrorIs(t, err, spate.ErrFatal)
	require.ErrorContains(t, err, "watermark 15 falls inside a packed record (rows 10 to 19)")

	// A row over the cap inside a packed record fails its batch.
	e := newSink(t, url, pgsink.Options{MaxRowBytes: 64})
	require.NoError(t, e.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 2, Partition: 5}, nil))
	wide := rows(5, 0, 20)
	wide[13].Value = append(wide[13].Value, bytes.Repeat([]byte{'x'}, 100)...)
	err = e.Write(ctx, 0, pack(wide, 10))
	require.ErrorIs(t, err, spate.ErrFatal)
	require.ErrorContains(t, err, `the row with key "14" is 106 bytes, over the cap of 64`)
	var n int
	require.NoError(t, c.QueryRow(ctx, "SELECT count(*) FROM dst").Scan(&n))
	require.Zero(t, n)
}

// lockTable takes an ACCESS EXCLUSIVE lock on table in a transaction of
// a connection of its own, closed when the test ends. Roll the
// transaction back to let the lock go.
func lockTable(t testing.TB, url, table string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	locker, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Close(ctx) })
	tx, err := locker.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	return tx
}

// A flush blocked in the database (another session holds a lock on the
// destination) ends within half the lease, rolled back, with a retryable
// error naming the time out; tried again once the lock is gone, it writes
// each row once.
func TestBlockedFlushEndsBeforeTheLease(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, "CREATE TABLE dst (id int, v text)")
	ctx := context.Background()
	const lease = 2 * time.Second
	s := newSink(t, url, pgsink.Options{Lease: lease})
	split := spate.MustSplitID("chunk-000000")
	require.NoError(t, s.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 1, Partition: 1}, nil))
	require.NoError(t, s.Write(ctx, 0, rows(1, 0, 100)))

	tx := lockTable(t, url, "dst")

	done := make(chan error, 1)
	go func() {
		_, _, _, err := s.Prepare(ctx, 1, 50, false)
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(20 * lease): // a bound far past the flush's time, not a speed check
		require.FailNow(t, "the blocked flush did not end")
	}
	require.Error(t, err)
	require.True(t, spate.IsRetryable(err), "retryable: %v", err)
	require.ErrorContains(t, err, "did not finish within 1s (half the lease of 2s")
	require.NoError(t, tx.Rollback(ctx))
	w, _ := fenceRow(t, c, split.String())
	require.Zero(t, w, "the fence did not move")

	_, _, _, err = s.Prepare(ctx, 1, 50, false)
	require.NoError(t, err)
	_, _, _, err = s.Prepare(ctx, 1, 100, true)
	require.NoError(t, err)
	requireExactlyOnce(t, c, "dst", 100)
}

// A flush whose commit went through while its client saw an error is
// tried again as a whole: the rows the fence says the table holds are not
// written again. (Modelled by a second tenancy at the same epoch, opened
// before the first one's flush.)
func TestFlushTriedAgainAfterItsCommitWritesNothingTwice(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, "CREATE TABLE dst (id int, v text)")
	ctx := context.Background()
	split := spate.MustSplitID("chunk-000000")
	a, b := newSink(t, url, pgsink.Options{}), newSink(t, url, pgsink.Options{})
	require.NoError(t, a.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 1, Partition: 1}, nil))
	require.NoError(t, b.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 1, Partition: 2}, nil))
	require.NoError(t, a.Write(ctx, 0, rows(1, 0, 60)))
	_, _, _, err := a.Prepare(ctx, 1, 40, false)
	require.NoError(t, err)
	// b's flush holds rows 0..59, 0..39 of which are in the table already.
	require.NoError(t, b.Write(ctx, 0, rows(2, 0, 60)))
	_, _, _, err = b.Prepare(ctx, 2, 30, false) // all in the table: nothing written
	require.NoError(t, err)
	_, _, _, err = b.Prepare(ctx, 2, 60, false)
	require.NoError(t, err)
	requireExactlyOnce(t, c, "dst", 60, split)
}

// Rows are flushed ahead of the commit, in the background, once a
// quarter of FlushBytes is staged: the table fills while the source reads
// on, not only when a commit comes or memory is full. The commit then
// writes the rest, each row once.
func TestRowsAreFlushedAheadOfTheCommit(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, "CREATE TABLE dst (id int, v text)")
	ctx := context.Background()
	const lease = 2 * time.Second
	s := newSink(t, url, pgsink.Options{FlushBytes: 4000, Lease: lease})
	split := spate.MustSplitID("chunk-000000")
	require.NoError(t, s.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 1, Partition: 1}, nil))
	// 150 rows of about 11 bytes: over a quarter of FlushBytes, under
	// FlushBytes.
	require.NoError(t, s.Write(ctx, 0, rows(1, 0, 150)))
	// A bound far past a flush's time (half the lease), not a speed check.
	waitUntil(t, 10*lease, "the staged rows reach the table with no commit", func() bool { return count(t, c, "dst") > 0 })
	require.NoError(t, s.Write(ctx, 0, rows(1, 150, 160)))
	out, _, _, err := s.Prepare(ctx, 1, 160, true)
	require.NoError(t, err)
	require.JSONEq(t, `{"epoch":1,"watermark":160}`, string(out))
	requireExactlyOnce(t, c, "dst", 160, split)
}

// A flush ahead of the commit that the table refuses (a row of another
// shape) is reported by the tenancy's next Write, naming the table, and
// nothing of it is written.
func TestFailedFlushAheadIsReportedByTheNextWrite(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, "CREATE TABLE dst (id int, v text)")
	ctx := context.Background()
	const lease = 2 * time.Second
	s := newSink(t, url, pgsink.Options{FlushBytes: 4000, Lease: lease})
	require.NoError(t, s.OpenStage(ctx, pipeline.StageTenancy{Split: spate.MustSplitID("bad"), Epoch: 1, Partition: 1}, nil))
	batch := rows(1, 0, 150)
	batch[70].Value = []byte("seventy-one\tv71") // not an int
	require.NoError(t, s.Write(ctx, 0, batch))
	var err error
	// The runtime retries a batch whose Write failed: the same records.
	// A bound far past a flush's time (half the lease), not a speed check.
	waitUntil(t, 10*lease, "a Write reports the failed flush", func() bool {
		err = s.Write(ctx, 0, batch)
		return err != nil
	})
	require.True(t, spate.IsFatal(err), "fatal: %v", err)
	require.ErrorContains(t, err, "table public.dst refuses the rows")
	require.Zero(t, count(t, c, "dst"), "nothing of the refused flush written")
}

// A Write that starts a flush ahead of the commit returns while the flush
// still runs: here it waits on a lock another session holds on the
// destination, so it cannot have ended when the Write returned. Once the
// lock is gone the flush and the commit write each row once.
func TestWriteReturnsWhileItsFlushRuns(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, "CREATE TABLE dst (id int, v text)")
	ctx := context.Background()
	// A long lease: a flush made synchronous would hold the Write for half
	// of it, then fail it.
	s := newSink(t, url, pgsink.Options{FlushBytes: 4000, Lease: 30 * time.Second})
	split := spate.MustSplitID("chunk-000000")
	require.NoError(t, s.OpenStage(ctx, pipeline.StageTenancy{Split: split, Epoch: 1, Partition: 1}, nil))

	tx := lockTable(t, url, "dst")

	// 150 rows of about 11 bytes: over a quarter of FlushBytes.
	require.NoError(t, s.Write(ctx, 0, rows(1, 0, 150)))
	// The flush it started waits on the lock: still running.
	waitUntil(t, time.Minute, "the sink's flush waits on the lock", func() bool {
		var n int
		require.NoError(t, c.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = 'spate' AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&n))
		return n > 0
	})
	require.NoError(t, tx.Rollback(ctx))

	_, _, _, err := s.Prepare(ctx, 1, 150, true)
	require.NoError(t, err)
	requireExactlyOnce(t, c, "dst", 150, split)
}
