package pgsource_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/pgservers"
	"github.com/spate-go/spate/pipeline"
	"github.com/spate-go/spate/pipeline/pgsource"
)

func TestMain(m *testing.M) { os.Exit(pgservers.Main(m)) }

// newDB returns a fresh database's URL and a connection to it.
func newDB(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	url := pgservers.Shared(t).NewDB(t)
	c, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return url, c
}

func exec(t *testing.T, c *pgx.Conn, sql string) {
	t.Helper()
	_, err := c.Exec(context.Background(), sql)
	require.NoError(t, err, sql)
}

// plan returns the split plan of src.
func plan(t *testing.T, src *pgsource.Source) []spate.SplitSpec {
	t.Helper()
	p, err := src.Plan(context.Background(), spate.PlanContext{})
	require.NoError(t, err)
	var out []spate.SplitSpec
	for _, s := range p.Splits {
		out = append(out, s.Spec)
	}
	return out
}

type bounds struct{ Lo, Hi *string }

// chunkRows counts the rows of table inside each split's bounds.
func chunkRows(t *testing.T, c *pgx.Conn, table, key, typ string, specs []spate.SplitSpec) []int64 {
	t.Helper()
	var out []int64
	for _, s := range specs {
		var b bounds
		require.NoError(t, json.Unmarshal(s.Descriptor, &b))
		var n int64
		require.NoError(t, c.QueryRow(context.Background(), fmt.Sprintf(
			"SELECT count(*) FROM %s WHERE ($1::%[3]s IS NULL OR %[2]s > $1::%[3]s) AND ($2::%[3]s IS NULL OR %[2]s <= $2::%[3]s)", table, key, typ),
			b.Lo, b.Hi).Scan(&n))
		out = append(out, n)
	}
	return out
}

func maxOverMean(ns []int64) float64 {
	var sum, mx int64
	for _, n := range ns {
		sum += n
		mx = max(mx, n)
	}
	return float64(mx) / (float64(sum) / float64(len(ns)))
}

// Chunk ends are found by probing, so sparse ids and one dense hot range
// still give chunks of even row counts (equal strides over min..max would
// put nearly every row in one chunk).
func TestChunksAreEvenOnSkewedKeys(t *testing.T) {
	url, c := newDB(t)
	// 20,000 sparse ids a million apart, then 40,000 dense ones.
	exec(t, c, `CREATE TABLE skew (id bigint PRIMARY KEY, v text);
		INSERT INTO skew SELECT i::bigint * 1000003, 'sparse' FROM generate_series(1, 20000) i;
		INSERT INTO skew SELECT 100000000000 + i, 'hot' FROM generate_series(1, 40000) i;`)
	src, err := pgsource.New(context.Background(), pgsource.Options{URL: url, Table: "skew", ChunkRows: 4000})
	require.NoError(t, err)
	specs := plan(t, src)
	ns := chunkRows(t, c, "skew", "id", "bigint", specs)
	var total int64
	for _, n := range ns {
		total += n
	}
	require.EqualValues(t, 60000, total, "the chunks cover every row once")
	ratio := maxOverMean(ns)
	t.Logf("%d chunks, rows per chunk %v, max/mean %.2f", len(ns), ns, ratio)
	require.LessOrEqual(t, ratio, 2.0)

	// What equal strides over min..max would have given, for contrast.
	var lo, hi int64
	require.NoError(t, c.QueryRow(context.Background(), "SELECT min(id), max(id) FROM skew").Scan(&lo, &hi))
	stride := (hi - lo + int64(len(ns))) / int64(len(ns))
	var strides []int64
	for i := range int64(len(ns)) {
		var n int64
		require.NoError(t, c.QueryRow(context.Background(), "SELECT count(*) FROM skew WHERE id >= $1 AND id < $2",
			lo+i*stride, lo+(i+1)*stride).Scan(&n))
		strides = append(strides, n)
	}
	t.Logf("equal strides instead: rows per chunk %v, max/mean %.2f", strides, maxOverMean(strides))
}

// The plan's weights are the chunks' rows and sum to the table's rows,
// also when the rows fill the probed chunks exactly and the open-ended
// last chunk (for keys inserted later) holds none.
func TestPlanWeightsSumToTheRows(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, `CREATE TABLE exact (id bigint PRIMARY KEY, v text);
		INSERT INTO exact SELECT i, 'x' FROM generate_series(1, 10000) i;`)
	for _, n := range []int64{2500, 3000} {
		src, err := pgsource.New(context.Background(), pgsource.Options{URL: url, Table: "exact", ChunkRows: n})
		require.NoError(t, err)
		specs := plan(t, src)
		ns := chunkRows(t, c, "exact", "id", "bigint", specs)
		var sum uint64
		for i, s := range specs {
			assert.EqualValues(t, ns[i], s.Weight, "chunk %s of %d rows", s.ID, n)
			sum += s.Weight
		}
		assert.EqualValues(t, 10000, sum, "chunks of %d rows", n)
	}
}

// drain polls l until its chunk is read, copying the payloads, and
// encodes a commit at every batch end.
func drain(t *testing.T, src *pgsource.Source, id spate.SplitID, l pipeline.Lane, limit int, stopAfter int) ([]pipeline.RawPayload, spate.SplitProgress) {
	t.Helper()
	var out []pipeline.RawPayload
	var last spate.SplitProgress
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		b, err := l.Poll(limit, 10*time.Millisecond)
		if err != nil {
			t.Logf("poll: %v", err)
			continue
		}
		if b == nil {
			p, err := src.Sweep(id)
			require.NoError(t, err)
			if p != nil {
				return out, *p
			}
			if last.Completed {
				return out, last
			}
			continue
		}
		for _, p := range b.Payloads {
			p.Key, p.Value = bytes.Clone(p.Key), bytes.Clone(p.Value)
			out = append(out, p)
		}
		b.Ack.Release()
		last, err = src.EncodeCommit(id, out[len(out)-1].Offset+1)
		require.NoError(t, err)
		if stopAfter > 0 && len(out) >= stopAfter {
			return out, last
		}
	}
	require.Fail(t, "the lane never ended")
	return nil, last
}

func open(t *testing.T, src *pgsource.Source, spec spate.SplitSpec, p *spate.SplitProgress, poison func(string)) pipeline.Lane {
	t.Helper()
	if poison == nil {
		poison = func(r string) { t.Errorf("poison: %s", r) }
	}
	l, err := src.OpenSplit(pipeline.SplitOpening{Spec: spec, Progress: p, Issuer: pipeline.NewCheckpointer(nil).Issuer(),
		Waker: spate.InertWaker(), Poison: poison})
	require.NoError(t, err)
	return l
}

// Every row of every chunk is read exactly once, also across a resume in
// the middle of a chunk, for text keys with quotes, backslashes, tabs and
// newlines, and for uuid keys; offsets are ordinals within the chunk.
func TestReadsEveryRowOnceAcrossResumes(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, `CREATE TABLE words (w text PRIMARY KEY, n int, note text);
		INSERT INTO words SELECT 'w' || lpad(i::text, 6, '0') || CASE i % 4 WHEN 0 THEN '''q' WHEN 1 THEN E'\\b' WHEN 2 THEN E'\t' ELSE E'\n' END, i, CASE WHEN i % 3 = 0 THEN NULL ELSE 'x' END
		FROM generate_series(1, 9000) i;
		CREATE TABLE ids (id uuid PRIMARY KEY, n int);
		INSERT INTO ids SELECT md5(i::text)::uuid, i FROM generate_series(1, 7000) i;`)
	for _, tc := range []struct{ table, key string }{{"words", "w"}, {"ids", "id"}} {
		t.Run(tc.table, func(t *testing.T) {
			src, err := pgsource.New(context.Background(), pgsource.Options{URL: url, Table: tc.table, ChunkRows: 2000})
			require.NoError(t, err)
			specs := plan(t, src)
			require.Greater(t, len(specs), 3)
			seen := map[string]int{}
			for i, spec := range specs {
				var rows []pipeline.RawPayload
				if i%2 == 0 {
					// Read part of the chunk, commit, hand it over, resume.
					l := open(t, src, spec, nil, nil)
					head, p := drain(t, src, spec.ID, l, 300, 700)
					src.CloseSplit(spec.ID)
					require.NoError(t, src.ValidateResume(spec, p))
					l = open(t, src, spec, &p, nil)
					tail, _ := drain(t, src, spec.ID, l, 300, 0)
					src.CloseSplit(spec.ID)
					require.EqualValues(t, p.Watermark, tail[0].Offset, "a resume numbers rows on from the watermark")
					rows = append(head, tail...)
				} else {
					l := open(t, src, spec, nil, nil)
					rows, _ = drain(t, src, spec.ID, l, 1000, 0)
					src.CloseSplit(spec.ID)
				}
				for j, r := range rows {
					require.EqualValues(t, j, r.Offset)
					f := pgsource.Fields(r.Value)
					require.Len(t, f, len(src.Table().Columns))
					seen[*f[0]]++
				}
			}
			var want []string
			rs, err := c.Query(context.Background(), fmt.Sprintf("SELECT %s::text FROM %s", tc.key, tc.table))
			require.NoError(t, err)
			want, err = pgx.CollectRows(rs, pgx.RowTo[string])
			require.NoError(t, err)
			var dups, missing int
			for _, w := range want {
				switch seen[w] {
				case 0:
					missing++
				case 1:
				default:
					dups += seen[w] - 1
				}
			}
			require.Len(t, seen, len(want))
			require.Zero(t, dups, "duplicates")
			require.Zero(t, missing, "missing")
		})
	}
}

// A connection lost in the middle of a chunk is read again from the last
// key emitted: nothing twice, nothing lost.
func TestLostConnectionResumesAfterTheLastKey(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, `CREATE TABLE big (id int PRIMARY KEY, pad text);
		INSERT INTO big SELECT i, repeat('p', 200) FROM generate_series(1, 60000) i;`)
	src, err := pgsource.New(context.Background(), pgsource.Options{URL: url, Table: "big", ChunkRows: 100000})
	require.NoError(t, err)
	specs := plan(t, src)
	require.Len(t, specs, 1)
	l := open(t, src, specs[0], nil, nil)
	head, _ := drain(t, src, specs[0].ID, l, 500, 500)
	var killed int
	require.NoError(t, c.QueryRow(context.Background(),
		"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE query LIKE 'COPY (SELECT%' AND pid <> pg_backend_pid()").Scan(&killed))
	require.Equal(t, 1, killed, "the chunk's read was in progress")
	tail, p := drain(t, src, specs[0].ID, l, 5000, 0)
	require.True(t, p.Completed)
	ids := map[string]int{}
	for i, r := range append(head, tail...) {
		require.EqualValues(t, i, r.Offset)
		ids[string(r.Key)]++
	}
	require.Len(t, ids, 60000)
	require.Len(t, append(head, tail...), 60000, "no row twice")
}

// A row over MaxRowBytes sets its chunk aside with a reason naming the
// table, the row's key and the option to raise; the rows before it are
// read.
func TestRowOverTheCapSetsItsChunkAside(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, `CREATE TABLE wide (id int PRIMARY KEY, v text);
		INSERT INTO wide SELECT i, 'short' FROM generate_series(1, 10) i;
		UPDATE wide SET v = repeat('w', 5000) WHERE id = 7;`)
	src, err := pgsource.New(context.Background(), pgsource.Options{URL: url, Table: "wide", MaxRowBytes: 4096})
	require.NoError(t, err)
	specs := plan(t, src)
	var reasons []string
	l := open(t, src, specs[0], nil, func(r string) { reasons = append(reasons, r) })
	var got int
	for range 200 {
		b, err := l.Poll(100, 5*time.Millisecond)
		require.NoError(t, err)
		if b != nil {
			got += len(b.Payloads)
			b.Ack.Release()
		}
		if len(reasons) > 0 {
			break
		}
	}
	require.Len(t, reasons, 1)
	require.Contains(t, reasons[0], `table public.wide: the row with key id = "7"`)
	require.Contains(t, reasons[0], "raise Options.MaxRowBytes")
	require.Equal(t, 6, got, "the rows before it are read")
}

// Bad input is refused at New with an error naming the table and the fix.
func TestBadInputNamesTheTableAndTheFix(t *testing.T) {
	url, c := newDB(t)
	// Roles belong to the whole server, which the package's tests share:
	// a fixed name would exist already on a second run (-count=2).
	role := "reader_" + strings.ToLower(rand.Text()[:10])
	exec(t, c, `CREATE TABLE comp (a int, b int, PRIMARY KEY (a, b));
		CREATE TABLE nopk (a int);
		CREATE TABLE ts (at timestamptz PRIMARY KEY);
		CREATE TABLE nonuniq (id int NOT NULL, v text);
		CREATE TABLE nullable (id int UNIQUE, v text);
		CREATE TABLE ok (id int PRIMARY KEY, v text);
		CREATE ROLE `+role+` LOGIN;`)
	cases := []struct {
		name string
		o    pgsource.Options
		want []string
	}{
		{"missing table", pgsource.Options{Table: "nosuch"}, []string{`table "nosuch" does not exist`, "schema-qualify"}},
		{"missing column", pgsource.Options{Table: "ok", Columns: []string{"id", "nope"}}, []string{`table public.ok has no column "nope" (Columns)`, "id, v"}},
		{"missing key", pgsource.Options{Table: "ok", Key: "nope"}, []string{`table public.ok has no key column "nope" (Key)`}},
		{"composite key", pgsource.Options{Table: "comp"}, []string{"table public.comp has a composite primary key (a, b)", "set Key"}},
		{"no primary key", pgsource.Options{Table: "nopk"}, []string{"table public.nopk has no primary key", "set Key"}},
		{"key type", pgsource.Options{Table: "ts"}, []string{"the key public.ts.at is of type timestamp with time zone", "integer, text or uuid"}},
		{"not unique", pgsource.Options{Table: "nonuniq", Key: "id"}, []string{"public.nonuniq.id has no unique index", "create a unique index"}},
		{"nullable", pgsource.Options{Table: "nullable", Key: "id"}, []string{"public.nullable.id may be NULL", "NOT NULL"}},
		{"bad filter", pgsource.Options{Table: "ok", Where: "nope > 1"}, []string{`the filter (Where) "nope > 1" on table public.ok does not run`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.URL = url
			_, err := pgsource.New(context.Background(), tc.o)
			require.Error(t, err)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
	t.Run("permission", func(t *testing.T) {
		u := pgservers.Shared(t).URL("x")
		db := url[len(u)-len("x?sslmode=disable"):]
		ru := fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s", role, pgservers.Shared(t).Port(), db)
		_, err := pgsource.New(context.Background(), pgsource.Options{URL: ru, Table: "ok"})
		require.ErrorContains(t, err, "no SELECT permission on table public.ok: GRANT SELECT ON public.ok TO")
	})
}

// The filter and the column list shape what is read; chunks count the
// filtered rows.
func TestFilterAndColumns(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, `CREATE TABLE ev (id int PRIMARY KEY, kind text, body text);
		INSERT INTO ev SELECT i, CASE WHEN i % 10 = 0 THEN 'keep' ELSE 'drop' END, 'b' || i FROM generate_series(1, 5000) i;`)
	src, err := pgsource.New(context.Background(), pgsource.Options{URL: url, Table: "ev", Where: "kind = 'keep'", Columns: []string{"body", "id"}, ChunkRows: 100})
	require.NoError(t, err)
	specs := plan(t, src)
	require.Len(t, specs, 6, "500 filtered rows in 5 chunks of 100, and the open end")
	var bodies []string
	for _, spec := range specs {
		rows, p := drain(t, src, spec.ID, open(t, src, spec, nil, nil), 1000, 0)
		require.True(t, p.Completed)
		for _, r := range rows {
			f := pgsource.Fields(r.Value)
			require.Len(t, f, 2)
			require.Equal(t, "b"+*f[1], *f[0])
			bodies = append(bodies, *f[0])
		}
	}
	require.Len(t, bodies, 500)
	require.True(t, slices.Contains(bodies, "b5000"))
}

// A Decoder gives a library user the rows as typed values, as pgx's
// Rows.Values would: the same values a query returns, NULLs as nil, text
// with tabs, newlines and backslashes intact, a domain as its base type
// and an enum as its text.
func TestDecoderGivesTypedValues(t *testing.T) {
	url, c := newDB(t)
	exec(t, c, `CREATE TYPE mood AS ENUM ('sad', 'ok');
		CREATE DOMAIN posint AS int CHECK (VALUE > 0);
		CREATE TABLE typed (id bigint PRIMARY KEY, small smallint, n int, p posint, f float8, num numeric, ok bool,
			at timestamptz, day date, u uuid, b bytea, j jsonb, arr int[], t text, m mood, nothing text);
		INSERT INTO typed SELECT i, i::smallint, -i, i, i / 4.0, i * 1.5, i % 2 = 0,
			'2026-01-02 03:04:05+00'::timestamptz + i * interval '1 hour', '2026-01-02'::date + i,
			('00000000-0000-0000-0000-00000000000' || i)::uuid, decode('00ff5c0a09', 'hex'), jsonb_build_object('i', i, 's', E'a\tb'),
			ARRAY[i, NULL, 3], E'tab\there\nline\\back ' || i, 'ok', NULL
		FROM generate_series(1, 5) i;`)
	ctx := context.Background()
	src, err := pgsource.New(ctx, pgsource.Options{URL: url, Table: "typed"})
	require.NoError(t, err)
	dec, err := src.Decoder(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"id", "small", "n", "p", "f", "num", "ok", "at", "day", "u", "b", "j", "arr", "t", "m", "nothing"}, dec.Columns())
	specs := plan(t, src)
	require.Len(t, specs, 1)
	rows, _ := drain(t, src, specs[0].ID, open(t, src, specs[0], nil, nil), 100, 0)
	require.Len(t, rows, 5)
	// What pgx's own query decoding gives, row by row.
	q, err := c.Query(ctx, "SELECT * FROM typed ORDER BY id")
	require.NoError(t, err)
	var want [][]any
	for q.Next() {
		vs, err := q.Values()
		require.NoError(t, err)
		want = append(want, vs)
	}
	require.NoError(t, q.Err())
	for i, r := range rows {
		got, err := dec.Decode(r.Value)
		require.NoError(t, err)
		require.Len(t, got, 16)
		for k, name := range dec.Columns() {
			switch name {
			case "at": // COPY prints it in the session's zone: the same instant
				require.True(t, want[i][k].(time.Time).Equal(got[k].(time.Time)), "row %d column %s: %v, want %v", i, name, got[k], want[i][k])
			case "num": // the same number (a binary and a text decoding may scale it apart)
				w, err := want[i][k].(pgtype.Numeric).Float64Value()
				require.NoError(t, err)
				g, err := got[k].(pgtype.Numeric).Float64Value()
				require.NoError(t, err)
				require.Equal(t, w, g, "row %d column %s", i, name)
			case "m": // an enum pgx's map does not know: its text
				require.Equal(t, "ok", got[k])
			default:
				require.Equal(t, want[i][k], got[k], "row %d column %s", i, name)
			}
		}
		m, err := dec.DecodeMap(r.Value)
		require.NoError(t, err)
		require.Equal(t, int64(i+1), m["id"])
		require.Equal(t, fmt.Sprintf("tab\there\nline\\back %d", i+1), m["t"])
		require.Equal(t, []byte{0, 0xff, '\\', '\n', '\t'}, m["b"])
		require.Nil(t, m["nothing"])
	}
	_, err = dec.Decode([]byte("1\t2"))
	require.ErrorContains(t, err, "pgsource: table public.typed: a row of 2 columns, and 16 were read")
}

// A chunk's reader fills again the memory of rows the runtime is done
// with (the contract: after the lane's next Poll) instead of a fresh
// megabyte for every batch: reading a 32 MB table allocates a fraction of
// it, and every row arrives once, intact.
func TestReaderReusesTheMemoryOfRowsEmitted(t *testing.T) {
	url, c := newDB(t)
	const n, width = 32000, 1000
	exec(t, c, fmt.Sprintf(`CREATE TABLE wide (id int PRIMARY KEY, pad text);
		INSERT INTO wide SELECT i, repeat(chr(97 + i %% 26), %d) FROM generate_series(1, %d) i;`, width, n))
	src, err := pgsource.New(context.Background(), pgsource.Options{URL: url, Table: "wide", ChunkRows: 2 * n, PackRows: true})
	require.NoError(t, err)
	specs := plan(t, src)
	require.Len(t, specs, 1)
	l := open(t, src, specs[0], nil, nil)

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	next, batches := 1, 0
	idBuf := make([]byte, 0, 16)
	deadline := time.Now().Add(time.Minute)
	for next <= n {
		require.True(t, time.Now().Before(deadline), "the chunk was not read in a minute: %d rows", next-1)
		b, err := l.Poll(100, 10*time.Millisecond)
		require.NoError(t, err)
		if b == nil {
			continue
		}
		batches++
		for _, p := range b.Payloads {
			// Checked in place: the test allocates nothing per row.
			for line := range bytes.SplitSeq(p.Value, []byte{'\n'}) {
				id := strconv.AppendInt(idBuf[:0], int64(next), 10)
				pad, ok := bytes.CutPrefix(line, append(id, '\t'))
				if !ok || len(pad) != width || bytes.Count(pad, []byte{byte('a' + next%26)}) != width {
					require.FailNow(t, "a row out of order, repeated or damaged", "row %d: %.40q", next, line)
				}
				next++
			}
		}
		b.Ack.Release()
	}
	runtime.ReadMemStats(&after)
	allocated := after.TotalAlloc - before.TotalAlloc
	t.Logf("%d rows in %d batches, %d MB allocated", n, batches, allocated>>20)
	require.Greater(t, batches, 20)
	require.Less(t, allocated, uint64(n*width/2), "bytes allocated to read %d MB: batches are read into fresh memory", n*width>>20)
}
