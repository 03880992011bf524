package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/internal/etcdservers"
	"github.com/spate-go/spate/internal/pgservers"
)

// tableDB is a fresh database of the package's PostgreSQL server: its URL
// (as the superuser, no password: the test server trusts local
// connections) and a connection to it.
func tableDB(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	u := pgservers.Shared(t).NewDB(t)
	c, err := pgx.Connect(context.Background(), u)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return u, c
}

func sqlExec(t *testing.T, c *pgx.Conn, sql string, args ...any) {
	t.Helper()
	_, err := c.Exec(context.Background(), sql, args...)
	require.NoError(t, err, sql)
}

func sqlInt(t *testing.T, c *pgx.Conn, sql string) int64 {
	t.Helper()
	var n int64
	require.NoError(t, c.QueryRow(context.Background(), sql).Scan(&n), sql)
	return n
}

// withPassword puts a password into a test server's URL (the server
// trusts every local connection, so any password gets in).
func withPassword(u, pw string) string {
	return strings.Replace(u, "postgres://postgres@", "postgres://postgres:"+url.QueryEscape(pw)+"@", 1)
}

const tableSecret = "pg-s3cret-do-not-print"

// A table is copied into another by two worker processes sharing one
// store, and the backfill verifies it (row counts and checksums by chunk).
// The password, given in the source's URL and in the destination's
// password_file, is printed nowhere. inspect shows the splits' rows and key
// ranges, the job's fence rows are gone once it completed, and spate verify
// agrees; once one row of the copy is changed, and then one deleted,
// verify fails naming the chunk that holds it, with its key range.
func TestBackfillTableToTableWithTwoWorkers(t *testing.T) {
	t.Parallel()
	base, c := tableDB(t)
	sqlExec(t, c, `CREATE TABLE events (id bigint PRIMARY KEY, body text, n int);
		INSERT INTO events SELECT i, 'event ' || i || E'\twith a tab', i % 7 FROM generate_series(1, 20000) i;
		CREATE TABLE events_copy (LIKE events)`)
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "pw")
	require.NoError(t, os.WriteFile(pwFile, []byte(tableSecret+"\n"), 0o600))
	src := withPassword(base, tableSecret) + "&table=events&chunk_rows=2000"
	dst := base + "&table=events_copy&password_file=" + url.QueryEscape(pwFile)

	cluster := etcdservers.Start(t, etcdservers.Options{})
	storeArgs := []string{"--store", "etcd://" + cluster.Members()[0].ClientURL.Host, "--job", "events"}
	args := append([]string{"backfill", "--src", src, "--dst", dst, "--lease", "2s", "--lanes", "2",
		"--commit-interval", "200ms", "--rate", "5000"}, storeArgs...)
	w1 := start(t, dir, "", args...)
	w2 := start(t, dir, "", args...)
	gained := 0
	for i, w := range []*proc{w1, w2} {
		code := w.wait(t, 120*time.Second)
		out, errOut := w.stdout.String(), w.stderr.String()
		expectCode(t, fmt.Sprintf("worker %d", i+1), code, 0, out, errOut)
		require.Contains(t, out, "verified: public.events_copy holds the 20,000 rows of public.events, row count and checksum equal in all 11 chunks of id", "worker %d:\n%s", i+1, out)
		require.NotContains(t, out+errOut, tableSecret, "worker %d printed the password", i+1)
		m := regexp.MustCompile(`this worker gained (\d+)`).FindStringSubmatch(out)
		require.NotNil(t, m, out)
		var n int
		fmt.Sscan(m[1], &n)
		gained += n
		t.Logf("worker %d gained %d splits", i+1, n)
	}
	require.GreaterOrEqual(t, gained, 11, "the two workers gained fewer splits than the plan has")
	require.EqualValues(t, 20000, sqlInt(t, c, "SELECT count(*) FROM events_copy"))
	require.EqualValues(t, 20000, sqlInt(t, c, "SELECT count(DISTINCT id) FROM events_copy"))
	require.EqualValues(t, 0, sqlInt(t, c, "SELECT count(*) FROM (TABLE events EXCEPT TABLE events_copy) d"))
	require.EqualValues(t, 0, sqlInt(t, c, "SELECT count(*) FROM spate_fence"), "the completed job's fence rows are still there")

	// inspect: rows and key ranges.
	q := inspectJSON(t, dir, storeArgs)
	require.Equal(t, "complete", q.Summary.State)
	require.Equal(t, "rows", q.Summary.Unit)
	// A completed chunk counts the rows it copied: the last chunk, above
	// the highest key, is empty and adds none (the store records its
	// weight as 1).
	require.EqualValues(t, 20000, q.Summary.BytesCommitted)
	require.Equal(t, q.Summary.BytesTotal, q.Summary.BytesCommitted)
	require.Len(t, q.Splits, 11)
	require.Equal(t, "id <= 2000", q.Splits[0].Keys)
	require.Equal(t, "id in (12000, 14000]", q.Splits[6].Keys)
	require.Equal(t, "id > 20000", q.Splits[10].Keys)
	code, text, errOut := runSpate(t, dir, "", 60*time.Second, append([]string{"inspect"}, storeArgs...)...)
	expectCode(t, "inspect", code, 0, text, errOut)
	require.Contains(t, text, "rows      20,000 of 20,000 committed (100%)", text)
	require.Regexp(t, `chunk-000006\s+completed\s.*\sid in \(12000, 14000\]`, text)

	// Every worker of the job reads the same table the same way and writes
	// the same table: another database's table of the same name and
	// shape, another chunk size, another destination are refused.
	other, oc := tableDB(t)
	sqlExec(t, oc, "CREATE TABLE events (id bigint PRIMARY KEY, body text, n int)")
	sqlExec(t, c, "CREATE TABLE events_copy2 (LIKE events)")
	for _, tc := range []struct{ name, src, dst, want string }{
		{"another database", other + "&table=events&chunk_rows=2000", dst, "--src          the job's postgres://127.0.0.1:"},
		{"another chunk size", withPassword(base, tableSecret) + "&table=events&chunk_rows=1000", dst, "belongs to another source or other split options"},
		{"another destination", src, base + "&table=events_copy2", "--dst          the job's postgres://"},
	} {
		code, out, errOut := runSpate(t, dir, "", 60*time.Second, append([]string{"backfill", "--src", tc.src, "--dst", tc.dst, "--lease", "2s"}, storeArgs...)...)
		expectCode(t, tc.name, code, exitUsage, out, errOut)
		require.Contains(t, errOut, tc.want, tc.name)
		require.NotContains(t, out+errOut, tableSecret, tc.name)
	}
	require.EqualValues(t, 0, sqlInt(t, c, "SELECT count(*) FROM events_copy2"))

	verify := func() (int, string) {
		code, out, errOut := runSpate(t, dir, "", 60*time.Second, "verify", "--src", src, "--dst", dst)
		require.NotContains(t, out+errOut, tableSecret, "verify printed the password")
		return code, out + errOut
	}
	code, out := verify()
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "verified: public.events_copy holds the 20,000 rows", out)

	sqlExec(t, c, "UPDATE events_copy SET body = 'changed' WHERE id = 12345")
	code, out = verify()
	require.Equal(t, exitFailed, code, out)
	require.Contains(t, out, "VERIFICATION FAILED: 1 of 11 chunks differ", out)
	require.Contains(t, out, "first: chunk-000006 (id in (12000, 14000]): both hold 2,000 rows, but their checksums differ", out)

	sqlExec(t, c, "DELETE FROM events_copy WHERE id = 3")
	code, out = verify()
	require.Equal(t, exitFailed, code, out)
	require.Contains(t, out, "2 of 11 chunks differ", out)
	require.Contains(t, out, "first: chunk-000000 (id <= 2000): public.events has 2,000 rows, public.events_copy has 1,999", out)
	require.Contains(t, out, "also chunk-000006 (id in (12000, 14000])", out)
}

// A table is copied into a directory, one row a line ("<key>\t<row>",
// the row in COPY text format: a tab or newline in a value is escaped, so
// a row is one line), with a filter and a column list, and the backfill
// verifies it row by row. spate verify agrees, and fails naming the row
// and the output file once the table no longer matches.
func TestBackfillTableToDirectory(t *testing.T) {
	t.Parallel()
	base, c := tableDB(t)
	sqlExec(t, c, `CREATE TABLE users (name text PRIMARY KEY, note text, age int);
		INSERT INTO users SELECT 'user' || lpad(i::text, 5, '0'), E'line one\nline\ttwo', i FROM generate_series(1, 3000) i`)
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	src := base + "&table=users&columns=name,note&where=" + url.QueryEscape("age % 2 = 0") + "&chunk_rows=500"
	code, stdout, stderr := runSpate(t, dir, "", 90*time.Second, "backfill", "--src", src, "--dst", out, "--store", "mem://", "--lease", "1s")
	expectCode(t, "backfill to a directory", code, 0, stdout, stderr)
	require.Contains(t, stdout, "verified exactly once: all 1,500 rows of public.users are in the output once", stdout)
	data, err := os.ReadFile(filepath.Join(out, "chunk-000000.out"))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(data), "user00002\tuser00002\tline one\\nline\\ttwo\n"), "%.200s", data)

	code, stdout, stderr = runSpate(t, dir, "", 60*time.Second, "verify", "--src", src, "--dst", out)
	expectCode(t, "verify", code, 0, stdout, stderr)
	// The same into a bucket.
	bucket := "file://" + filepath.ToSlash(filepath.Join(dir, "bucket"))
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "bucket"), 0o755))
	code, stdout, stderr = runSpate(t, dir, "", 90*time.Second, "backfill", "--src", src, "--dst", bucket, "--store", "mem://", "--lease", "1s")
	expectCode(t, "backfill to a bucket", code, 0, stdout, stderr)
	require.Contains(t, stdout, "verified exactly once: all 1,500 rows of public.users are in the output once", stdout)
	sqlExec(t, c, "UPDATE users SET note = 'changed' WHERE name = 'user01234'")
	code, stdout, stderr = runSpate(t, dir, "", 60*time.Second, "verify", "--src", src, "--dst", out)
	expectCode(t, "verify after a change", code, exitFailed, stdout, stderr)
	require.Contains(t, stdout, "1 differ", stdout)
	require.Contains(t, stdout, "name user01234 differs in "+filepath.Join(out, "chunk-000001.out"), stdout)
}

// Bad input is refused before anything starts (exit 2), each with an error
// naming the table and the fix, and never the password.
func TestBackfillTableBadInput(t *testing.T) {
	t.Parallel()
	base, c := tableDB(t)
	role := fmt.Sprintf("spate_reader_%d", time.Now().UnixNano())
	sqlExec(t, c, `CREATE TABLE events (id bigint PRIMARY KEY, body text);
		INSERT INTO events SELECT i, 'e' || i FROM generate_series(1, 100) i;
		CREATE TABLE stamps (at timestamptz PRIMARY KEY, body text);
		CREATE TABLE events_copy (LIKE events);
		CREATE TABLE events_other (id bigint, body int);
		CREATE TABLE taken (LIKE events);
		CREATE TABLE spate_fence (job text NOT NULL, split text NOT NULL, dest text NOT NULL,
			epoch bigint NOT NULL, watermark bigint NOT NULL, last_key text, PRIMARY KEY (job, split));
		INSERT INTO spate_fence VALUES ('another-job', 'chunk-000000', 'public.taken', 3, 40, '40');
		CREATE ROLE `+role+` LOGIN`)
	t.Cleanup(func() { _, _ = c.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE "+role) })
	sec := withPassword(base, tableSecret)
	asRole := strings.Replace(base, "postgres://postgres@", "postgres://"+role+":"+tableSecret+"@", 1)
	dir := t.TempDir()
	for _, tc := range []struct {
		name     string
		src, dst string
		extra    []string
		want     []string
	}{
		{"missing table", sec + "&table=nope", sec + "&table=events_copy", nil,
			[]string{`table "nope" does not exist`, "schema-qualify it"}},
		{"missing column", sec + "&table=events&columns=id,nope", sec + "&table=events_copy", nil,
			[]string{`table public.events has no column "nope"`, "its columns are id, body"}},
		{"no permission", asRole + "&table=events", sec + "&table=events_copy", nil,
			[]string{"no SELECT permission on table public.events", "GRANT SELECT ON public.events TO"}},
		{"key it cannot range", sec + "&table=stamps", sec + "&table=events_copy", nil,
			[]string{"the key public.stamps.at is of type timestamp with time zone, which chunks cannot range over", "set Key (?key= in a URL)"}},
		{"destination of another shape", sec + "&table=events", sec + "&table=events_other", nil,
			[]string{`destination table public.events_other has column "body" of type integer, the source's is text`, "(LIKE source_table)"}},
		{"destination of another job", sec + "&table=events", sec + "&table=taken", nil,
			[]string{`destination table public.taken already holds the output of job "another-job"`, "DELETE FROM spate_fence WHERE job = 'another-job'"}},
		{"same table", sec + "&table=events", sec + "&table=events", nil,
			[]string{"--src and --dst name the same table"}},
		{"files into a table", dir, sec + "&table=events_copy", nil,
			[]string{"is a table, which takes a table's rows: --src must be a postgres:// table too"}},
		{"no table", sec, sec + "&table=events_copy", nil,
			[]string{"no ?table=: name the table"}},
		{"follow", sec + "&table=events", sec + "&table=events_copy", []string{"--follow"},
			[]string{"--follow does not apply to a table --src"}},
		{"options on the destination", sec + "&table=events", sec + "&table=events_copy&where=id>3", nil,
			[]string{"a destination table takes ?table= and password_file= only"}},
		{"unescaped @", "postgres://postgres:" + tableSecret + "@127.0.0.1:1/db?table=a@b", dir, nil,
			[]string{"escape it as %40"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"backfill", "--src", tc.src, "--dst", tc.dst, "--store", "mem://"}, tc.extra...)
			code, out, errOut := runSpate(t, dir, "", 60*time.Second, args...)
			expectCode(t, tc.name, code, exitUsage, out, errOut)
			for _, w := range tc.want {
				require.Contains(t, errOut, w)
			}
			require.NotContains(t, out+errOut, tableSecret, "the password is printed")
		})
	}
	require.EqualValues(t, 0, sqlInt(t, c, "SELECT count(*) FROM events_copy"), "a refused job wrote rows")
}

// The table URL's parameters are spate's or the driver's, and its
// identity leaves out the user and the password.
func TestParseTableURL(t *testing.T) {
	pw := filepath.Join(t.TempDir(), "pw")
	require.NoError(t, os.WriteFile(pw, []byte("from-file\n"), 0o600))
	tu, err := parseTableURL("postgres://alice:inline@db.example:5433/shop?sslmode=disable&table=app.orders&key=order_id&columns=a,+b&where=a+%3E+1&chunk_rows=500&max_row_bytes=4096&password_file="+url.QueryEscape(pw), true)
	require.NoError(t, err)
	require.Equal(t, "postgres://db.example:5433/shop?table=app.orders", tu.location)
	require.Equal(t, "app.orders", tu.opts.Table)
	require.Equal(t, "order_id", tu.opts.Key)
	require.Equal(t, []string{"a", "b"}, tu.opts.Columns)
	require.Equal(t, "a > 1", tu.opts.Where)
	require.EqualValues(t, 500, tu.opts.ChunkRows)
	require.Equal(t, 4096, tu.opts.MaxRowBytes)
	require.Equal(t, "postgres://alice:from-file@db.example:5433/shop?sslmode=disable", tu.conn)
	require.Equal(t, "postgres://alice:xxxxx@db.example:5433/shop?sslmode=disable&table=app.orders&key=order_id&columns=a,+b&where=a+%3E+1&chunk_rows=500&max_row_bytes=4096&password_file="+url.QueryEscape(pw), tu.shown)
	require.True(t, strings.HasPrefix(tableJob(tu.location), "app-orders-"), tableJob(tu.location))
	for _, bad := range []string{"postgres://h/db?table=t&chunk_rows=0", "postgres://h/db?table=t&max_row_bytes=x", "postgres://h/db",
		"postgres://h/db?table=t&chunk_rows=10&chunk_rows=20"} {
		_, err := parseTableURL(bad, true)
		require.Error(t, err, bad)
	}
}

// tableURLShapes place a secret (%[1]s) in a table URL.
var tableURLShapes = []string{
	"postgres://user:%[1]s@127.0.0.1:1/db?table=t",
	"postgresql://user:%[1]s@127.0.0.1:1/db?table=t&key=id",
	"postgres://user:%[1]s@127.0.0.1:1",
	"postgres://user:%[1]s@/db?table=t",
	"postgres://127.0.0.1:1/db?table=t&password=%[1]s",
	"postgres://127.0.0.1:1/db?table=t&sslpassword=%[1]s&sslmode=disable",
	"postgres://user:%[1]s@127.0.0.1:1/db?table=t#frag",
	"postgres://user:%[1]s@127.0.0.1:1/db?table=t&password=%[1]s",
	" postgres://user:%[1]s@h:1/db?table=t ",
	"postgres://user:%[1]s@h:notaport/db?table=t",
}

// No printed form of a table URL holds its password, whatever characters
// the password holds: the redacted URL, the errors of parsing it, the
// location (the job's identity and name).
func FuzzTableURLHidesSecrets(f *testing.F) {
	for _, s := range []string{"s3cret", "pa/ss", "pa?ss", "pa#ss", "pa@ss", "pa%ss", "pa%2Fss", "pa:ss", "pa&table=x",
		"p/a?s#s@w:o%r,d", "@127.0.0.1:1/", "=", "%zz", " ", "", "\x00\xff", "ü/ñ", "xxxxx"} {
		for shape := range tableURLShapes {
			f.Add(s, uint8(shape), false)
			f.Add(s, uint8(shape), true)
		}
	}
	f.Fuzz(func(t *testing.T, fuzzed string, shape uint8, escape bool) {
		secret := "Pw" + fuzzed + "Z9"
		inURL := secret
		if escape {
			inURL = url.QueryEscape(secret)
		}
		raw := fmt.Sprintf(tableURLShapes[int(shape)%len(tableURLShapes)], inURL)
		forms := []string{secret, url.QueryEscape(secret), url.PathEscape(secret),
			strings.TrimPrefix(url.UserPassword("u", secret).String(), "u:")}
		check := func(what, text string) {
			t.Helper()
			for _, s := range forms {
				require.NotContains(t, text, s, "%s of %q shows its secret", what, raw)
			}
		}
		check("redactTableURL", redactTableURL(raw))
		check("argShown", argShown(raw))
		for _, src := range []bool{true, false} {
			tu, err := parseTableURL(raw, src)
			if err != nil {
				check("the error of parseTableURL", err.Error())
				continue
			}
			check("the shown URL", tu.shown)
			check("the location", tu.location)
			check("the job name", tableJob(tu.location))
		}
	})
}

// A failed check of a table copy does not call the destination's rows
// duplicates: the summary's duplicates line says they are not known and
// gives both row counts (a by-hand trial's table short of 332,885 rows
// read "duplicates 1,667,115 rows in ...").
func TestFailedTableCheckDoesNotCallRowsDuplicates(t *testing.T) {
	r := &tableCopyResult{srcRows: 2_000_000, dstRows: 1_667_115, differ: []string{"chunk-000000"}}
	line := r.duplicates("DST")
	require.Equal(t, "not known: DST holds 1,667,115 rows, the source 2,000,000 (the verification below names the chunks that differ)", line)
}
