package pgsink_test

import (
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// benchRows is the size of the benchmarks' table.
const benchRows = 200_000

// BenchmarkTableCopy compares, in one run, a table copy by one spate worker
// (pgsource into pgsink over a mem store) with a plain pgx loop between the
// same tables: COPY ... TO STDOUT piped into COPY ... FROM STDIN. The ratio
// of their ns/op is the worker's overhead.
//
//	go test -run '^$' -bench BenchmarkTableCopy -benchtime 3x ./pipeline/pgsink/
func BenchmarkTableCopy(b *testing.B) {
	url, c := newDB(b)
	ctx := context.Background()
	exec(b, c, fmt.Sprintf(`CREATE TABLE src (id int PRIMARY KEY, v text, n bigint, at timestamptz);
		INSERT INTO src SELECT i, md5(i::text), i * 7, now() FROM generate_series(1, %d) i;
		CREATE TABLE dst (LIKE src); ANALYZE src;`, benchRows))
	reset := func(b *testing.B) {
		exec(b, c, "TRUNCATE dst; DELETE FROM spate_fence WHERE true")
	}
	exec(b, c, "CREATE TABLE IF NOT EXISTS spate_fence (job text NOT NULL, split text NOT NULL, dest text NOT NULL, epoch bigint NOT NULL, watermark bigint NOT NULL, last_key text, PRIMARY KEY (job, split))")
	b.Run("plain-pgx-copy", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			reset(b)
			b.StartTimer()
			plainCopy(b, ctx, url)
		}
		b.ReportMetric(float64(benchRows), "rows/op")
	})
	b.Run("spate-1-worker", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			reset(b)
			b.StartTimer()
			copyJob(b, url, 1, 50_000, false)
		}
		b.ReportMetric(float64(benchRows), "rows/op")
	})
	var n int
	require.NoError(b, c.QueryRow(ctx, "SELECT count(*) FROM dst").Scan(&n))
	require.Equal(b, benchRows, n)
}

func plainCopy(b *testing.B, ctx context.Context, url string) {
	from, err := pgx.Connect(ctx, url)
	require.NoError(b, err)
	defer from.Close(ctx)
	to, err := pgx.Connect(ctx, url)
	require.NoError(b, err)
	defer to.Close(ctx)
	r, w := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := from.PgConn().CopyTo(ctx, w, "COPY (SELECT * FROM src ORDER BY id) TO STDOUT")
		w.CloseWithError(err)
		done <- err
	}()
	_, err = to.PgConn().CopyFrom(ctx, r, "COPY dst FROM STDIN")
	require.NoError(b, err)
	require.NoError(b, <-done)
}
