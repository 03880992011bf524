package pgsink_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// benchRows is the size of BenchmarkTableCopy's table: 200,000 rows, or
// $SPATE_PGSINK_BENCH_ROWS (2000000 amortizes a job's fixed start and end
// costs as a real copy would).
func benchRows(b *testing.B) int {
	if v := os.Getenv("SPATE_PGSINK_BENCH_ROWS"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(b, err, "SPATE_PGSINK_BENCH_ROWS")
		return n
	}
	return 200_000
}

// BenchmarkTableCopy compares, in one run, a table copy by one spate worker
// (pgsource into pgsink over a mem store) with a plain pgx loop between the
// same tables: COPY ... TO STDOUT piped into COPY ... FROM STDIN on another
// connection. The ratio of their ns/op is the worker's overhead in time,
// the ratio of their cpu-ns/row its overhead in client CPU (the server is
// another process). -count N would run each case N times in a row; for
// rounds that alternate, run the test binary once per round:
//
//	go test -c -o pgsink.test ./pipeline/pgsink/
//	for i in 1 2 3 4 5 6; do ./pgsink.test -test.run '^$' -test.bench 'TableCopy|ScaleOut' -test.benchtime 1x; done | tee bench.txt
//	benchstat -col /case bench.txt; benchstat -col /workers bench.txt
func BenchmarkTableCopy(b *testing.B) {
	url, c := newDB(b)
	ctx := context.Background()
	rows := benchRows(b)
	benchTable(b, c, rows)
	b.Run("case=plain-pgx-copy", func(b *testing.B) {
		measure(b, c, rows, func() { plainCopy(b, ctx, url) })
	})
	b.Run("case=spate-1-worker", func(b *testing.B) {
		measure(b, c, rows, func() { copyJobAt(b, url, 1, 50_000, false, 0) })
	})
}

// scaleRows and scaleRate are the rate-limited benchmark's table size and
// each worker's rate.
const (
	scaleRows = 60_000
	scaleRate = 10_000
)

// BenchmarkScaleOut compares, in one run, one worker with three, each
// worker held to scaleRate rows a second: the ratio of their ns/op is how
// far the fleet scales out (goal: 3 workers at least 2.5× one).
//
// Run it in alternating rounds as BenchmarkTableCopy says.
func BenchmarkScaleOut(b *testing.B) {
	url, c := newDB(b)
	benchTable(b, c, scaleRows)
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			measure(b, c, scaleRows, func() { copyJobAt(b, url, n, 2_000, false, scaleRate) })
		})
	}
}

// benchTable makes src (rows rows) and an empty dst of its shape.
func benchTable(b *testing.B, c *pgx.Conn, rows int) {
	exec(b, c, fmt.Sprintf(`CREATE TABLE src (id int PRIMARY KEY, v text, n bigint, at timestamptz);
		INSERT INTO src SELECT i, md5(i::text), i * 7, now() FROM generate_series(1, %d) i;
		CREATE TABLE dst (LIKE src); ANALYZE src;
		CREATE TABLE IF NOT EXISTS spate_fence (job text NOT NULL, split text NOT NULL, dest text NOT NULL, epoch bigint NOT NULL, watermark bigint NOT NULL, last_key text, PRIMARY KEY (job, split))`, rows))
	// The first read of fresh rows sets their hint bits (writing pages):
	// VACUUM does it here, so that no case pays it for the others.
	exec(b, c, "VACUUM src")
}

// measure times copy (dst emptied before each), reporting rows/op and
// the client's CPU per row, and checks the copy.
func measure(b *testing.B, c *pgx.Conn, rows int, copy func()) {
	var cpu int64
	for b.Loop() {
		b.StopTimer()
		exec(b, c, "TRUNCATE dst; DELETE FROM spate_fence WHERE true")
		start := cpuTime()
		b.StartTimer()
		copy()
		b.StopTimer()
		cpu += cpuTime() - start
		b.StartTimer()
	}
	b.ReportMetric(float64(rows), "rows/op")
	if cpuTime() >= 0 {
		b.ReportMetric(float64(cpu)/float64(b.N)/float64(rows), "cpu-ns/row")
	}
	var n int
	require.NoError(b, c.QueryRow(context.Background(), "SELECT count(*) FROM dst").Scan(&n))
	require.Equal(b, rows, n)
}

func plainCopy(b *testing.B, ctx context.Context, url string) {
	from, err := pgx.Connect(ctx, url)
	require.NoError(b, err)
	defer from.Close(ctx)
	to, err := pgx.Connect(ctx, url)
	require.NoError(b, err)
	defer to.Close(ctx)
	// pgconn writes each row COPY sends as a Write of its own, and
	// CopyFrom sends each Read as a message of its own: unbuffered, the
	// pipe would hand over and send rows one by one. A shell pipe between
	// two psql buffers; so does this one.
	r, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		bw := bufio.NewWriterSize(w, 64<<10)
		_, err := from.PgConn().CopyTo(ctx, bw, "COPY (SELECT * FROM src ORDER BY id) TO STDOUT")
		if err == nil {
			err = bw.Flush()
		}
		w.CloseWithError(err)
		done <- err
	}()
	_, err = to.PgConn().CopyFrom(ctx, r, "COPY dst FROM STDIN")
	require.NoError(b, err)
	require.NoError(b, <-done)
}
