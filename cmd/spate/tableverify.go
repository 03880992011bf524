package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/pipeline/pgsource"
)

// verdict is a verification's outcome, for the backfill's summary.
type verdict interface {
	OK() bool
	report() string
	// duplicates is the summary's line on duplicates in dst.
	duplicates(dst string) string
}

func (r verifyResult) duplicates(dst string) string {
	return fmt.Sprintf("%s lines in %s (exactly-once: the output lists only what won commits covered)", count(r.Duplicates), dst)
}

// verifyTable checks a backfill of a table: against a table, row counts
// and checksums by chunk; against a directory or bucket, every row.
func verifyTable(ctx context.Context, in *tableInput, out *destination) (verdict, error) {
	if out.table != nil {
		return verifyTableCopy(ctx, in, out)
	}
	return verifyTableLines(ctx, in, out)
}

// chunkRange is one chunk of the plan: its split's id and key range.
type chunkRange struct {
	id     string
	lo, hi *string
}

// String renders the chunk's range for people: "id in (10, 20]".
func (c chunkRange) keys(key string) string {
	switch {
	case c.lo == nil && c.hi == nil:
		return "every " + key
	case c.lo == nil:
		return fmt.Sprintf("%s <= %s", key, *c.hi)
	case c.hi == nil:
		return fmt.Sprintf("%s > %s", key, *c.lo)
	}
	return fmt.Sprintf("%s in (%s, %s]", key, *c.lo, *c.hi)
}

// chunksOf plans the source as the job does (the same probing, the same
// ?chunk_rows=): the chunks and their upper bounds (all but the last's).
func chunksOf(ctx context.Context, src *pgsource.Source) ([]chunkRange, []string, error) {
	plan, err := src.Plan(ctx, spate.PlanContext{})
	if err != nil {
		return nil, nil, tableError(err)
	}
	var out []chunkRange
	var bounds []string
	for _, p := range plan.Splits {
		lo, hi, err := pgsource.KeyRange(p.Spec)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, chunkRange{id: p.Spec.ID.String(), lo: lo, hi: hi})
		if hi != nil {
			bounds = append(bounds, *hi)
		}
	}
	return out, bounds, nil
}

// chunkSum is one chunk's row count and checksum (the sum of a 64-bit
// hash of every row's text, as decimal text: order does not matter, a
// changed, missing or extra row does).
type chunkSum struct {
	rows int64
	sum  string
}

// chunkSums reads the count and checksum of every chunk of table in one
// scan: a row's chunk is the number of bounds below its key. Without
// the key (keyed false) the whole table is chunk 0.
func chunkSums(ctx context.Context, c *pgx.Conn, table string, t *pgsource.Table, where string, bounds []string, keyed bool) (map[int]chunkSum, error) {
	cols := make([]string, len(t.Columns))
	for i, col := range t.Columns {
		cols[i] = pgx.Identifier{col.Name}.Sanitize()
	}
	hash := "('x' || left(md5(ROW(" + strings.Join(cols, ", ") + ")::text), 16))::bit(64)::bigint"
	filter := ""
	if where != "" {
		filter = " WHERE (" + where + ")"
	}
	var q string
	var args []any
	if !keyed || len(bounds) == 0 {
		q = "SELECT 0, count(*), coalesce(sum(" + hash + "::numeric), 0)::text FROM " + table + filter
	} else {
		k := pgx.Identifier{t.Key}.Sanitize()
		arr := "($1::text[]::" + t.KeyType + "[])"
		q = "SELECT c, count(*), coalesce(sum(h::numeric), 0)::text FROM (" +
			"SELECT CASE WHEN w > 0 AND k = " + arr + "[w] THEN w - 1 ELSE w END AS c, h FROM (" +
			"SELECT width_bucket(" + k + ", " + arr + ") AS w, " + k + " AS k, " + hash + " AS h FROM " + table + filter +
			") a) b GROUP BY c"
		args = append(args, bounds)
	}
	rows, err := c.Query(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("checksum %s: %w", table, err)
	}
	out := map[int]chunkSum{}
	for rows.Next() {
		var i int
		var s chunkSum
		if err := rows.Scan(&i, &s.rows, &s.sum); err != nil {
			return nil, fmt.Errorf("checksum %s: %w", table, err)
		}
		out[i] = s
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("checksum %s: %w", table, err)
	}
	return out, nil
}

// tableCopyResult compares a source table with its copy, chunk by chunk.
type tableCopyResult struct {
	src, dst       string // the tables, for people
	key            string
	keyed          bool // the copy has the key: compared by chunk
	chunks         int
	srcRows        int64
	dstRows        int64
	differ         []string // the differing chunks, for people
	firstDifferent string   // the first differing chunk's id
}

func (r *tableCopyResult) OK() bool { return len(r.differ) == 0 }

func (r *tableCopyResult) duplicates(dst string) string {
	if r.OK() {
		return fmt.Sprintf("none in %s (every chunk holds the source's rows: count and checksum equal)", dst)
	}
	// Not "N duplicates": a failed check by chunk counts rows, and a
	// chunk short of rows may hide duplicates too.
	return fmt.Sprintf("not known: %s holds %s rows, the source %s (the verification below names the chunks that differ)", dst, count(r.dstRows), count(r.srcRows))
}

func (r *tableCopyResult) report() string {
	if r.OK() {
		how := fmt.Sprintf("in all %d chunks of %s", r.chunks, r.key)
		if !r.keyed {
			how = "over the whole table (the copy has no column " + r.key + " to chunk it by)"
		}
		return fmt.Sprintf("verified: %s holds the %s rows of %s, row count and checksum equal %s", r.dst, count(r.srcRows), r.src, how)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "VERIFICATION FAILED: %d of %d chunks differ between %s (%s rows) and %s (%s rows); first: %s",
		len(r.differ), r.chunks, r.src, count(r.srcRows), r.dst, count(r.dstRows), r.differ[0])
	for i, d := range r.differ[1:] {
		if i == 4 {
			fmt.Fprintf(&b, "\n  ... and %d more", len(r.differ)-5)
			break
		}
		fmt.Fprintf(&b, "\n  also %s", d)
	}
	return b.String()
}

// verifyTableCopy compares the source table (its filter applied) with the
// destination table: the row count and checksum of every chunk of the
// plan, naming each chunk that differs.
func verifyTableCopy(ctx context.Context, in *tableInput, out *destination) (*tableCopyResult, error) {
	t := in.src.Table()
	chunks, bounds, err := chunksOf(ctx, in.src)
	if err != nil {
		return nil, err
	}
	keyed := false
	for _, c := range t.Columns {
		keyed = keyed || c.Name == t.Key
	}
	sc, err := pgsource.Connect(ctx, in.url.conn)
	if err != nil {
		return nil, tableError(err)
	}
	defer sc.Close(context.WithoutCancel(ctx))
	srcSums, err := chunkSums(ctx, sc, t.Name, t, in.url.opts.Where, bounds, keyed)
	if err != nil {
		return nil, err
	}
	dc, err := pgsource.Connect(ctx, out.table.url.conn)
	if err != nil {
		return nil, tableError(err)
	}
	defer dc.Close(context.WithoutCancel(ctx))
	var dst string
	if err := dc.QueryRow(ctx, `SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = to_regclass($1)`, out.table.url.opts.Table).Scan(&dst); err != nil {
		return nil, fmt.Errorf("destination table %q: %w (does it exist?)", out.table.url.opts.Table, err)
	}
	dstSums, err := chunkSums(ctx, dc, dst, t, "", bounds, keyed)
	if err != nil {
		return nil, err
	}
	r := &tableCopyResult{src: t.Name, dst: dst, key: t.Key, keyed: keyed, chunks: len(chunks)}
	if !keyed {
		r.chunks = 1
		chunks = []chunkRange{{id: "the whole table"}}
	}
	for i, ch := range chunks {
		s, d := srcSums[i], dstSums[i]
		r.srcRows += s.rows
		r.dstRows += d.rows
		if s.rows == d.rows && (s.rows == 0 || s.sum == d.sum) {
			continue
		}
		why := fmt.Sprintf("%s has %s rows, %s has %s", t.Name, count(s.rows), dst, count(d.rows))
		if s.rows == d.rows {
			why = fmt.Sprintf("both hold %s rows, but their checksums differ (a row's values differ)", count(s.rows))
		}
		name := ch.id
		if keyed {
			name += " (" + ch.keys(t.Key) + ")"
		}
		r.differ = append(r.differ, name+": "+why)
		if r.firstDifferent == "" {
			r.firstDifferent = ch.id
		}
	}
	return r, nil
}

// tableLinesResult compares a source table with a backfill's output lines
// ("<key>\t<row>", the row in COPY text format).
type tableLinesResult struct {
	table                                 string
	rows, outLines                        int64
	files                                 int
	missing, dups, damaged, foreign, malf int64
	firstBad                              []string
}

func (r *tableLinesResult) OK() bool {
	return r.missing == 0 && r.dups == 0 && r.damaged == 0 && r.foreign == 0 && r.malf == 0
}

func (r *tableLinesResult) duplicates(dst string) string {
	return fmt.Sprintf("%s rows in %s (exactly-once: the output lists only what won commits covered)", count(r.dups), dst)
}

func (r *tableLinesResult) bad(s string) {
	if len(r.firstBad) < 5 {
		r.firstBad = append(r.firstBad, s)
	}
}

func (r *tableLinesResult) report() string {
	if r.OK() {
		return fmt.Sprintf("verified exactly once: all %s rows of %s are in the output once (%d files)", count(r.rows), r.table, r.files)
	}
	return fmt.Sprintf("VERIFICATION FAILED: of %s rows of %s, %s missing, %s duplicated, %s differ; the output holds %s lines in %d files, %s naming no row, %s malformed; first: %s",
		count(r.rows), r.table, count(r.missing), count(r.dups), count(r.damaged), count(r.outLines), r.files, count(r.foreign), count(r.malf), strings.Join(r.firstBad, "; "))
}

type keyedLine struct {
	hash uint64
	file int
}

// verifyTableLines checks the output files against the source table (its
// filter applied), row by row: each row's line must be in the output once,
// with the row's text as the table holds it now. Memory: the keys of the
// output.
func verifyTableLines(ctx context.Context, in *tableInput, out *destination) (*tableLinesResult, error) {
	t := in.src.Table()
	r := &tableLinesResult{table: t.Name}
	seen := map[string][]keyedLine{}
	var files []string
	err := out.eachOutput(ctx, func(name string, rd io.Reader) error {
		r.files++
		files = append(files, name)
		ls := newLineStream(rd)
		for {
			l, err := ls.next(true)
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return fmt.Errorf("read %s: %w", name, err)
			}
			r.outLines++
			if !l.cut {
				r.malf++
				r.bad(fmt.Sprintf("a line of %s without a key", name))
				continue
			}
			seen[string(l.head)] = append(seen[string(l.head)], keyedLine{hash: l.hash, file: len(files) - 1})
		}
	})
	if err != nil {
		return nil, err
	}
	c, err := pgsource.Connect(ctx, in.url.conn)
	if err != nil {
		return nil, tableError(err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	k := pgx.Identifier{t.Key}.Sanitize()
	cols := []string{k + "::text"}
	for _, col := range t.Columns {
		cols = append(cols, pgx.Identifier{col.Name}.Sanitize())
	}
	filter := ""
	if w := in.url.opts.Where; w != "" {
		filter = " WHERE (" + w + ")"
	}
	q := "COPY (SELECT " + strings.Join(cols, ", ") + " FROM " + t.Name + filter + " ORDER BY " + k + ") TO STDOUT"
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		_, err := c.PgConn().CopyTo(ctx, pw, q)
		pw.CloseWithError(err)
		done <- err
	}()
	ls := newLineStream(pr)
	for {
		l, err := ls.next(true)
		if err == io.EOF {
			break
		}
		if err != nil {
			_ = pr.CloseWithError(err)
			<-done
			return nil, fmt.Errorf("read %s: %w", t.Name, err)
		}
		r.rows++
		key := string(l.head)
		got := seen[key]
		delete(seen, key)
		n := 0
		for _, g := range got {
			if g.hash == l.hash {
				n++
			} else {
				r.damaged++
				r.bad(fmt.Sprintf("%s %s differs in %s", t.Key, key, files[g.file]))
			}
		}
		switch {
		case n == 0 && len(got) == 0:
			r.missing++
			r.bad(fmt.Sprintf("%s %s is missing", t.Key, key))
		case n > 1:
			r.dups += int64(n - 1)
			r.bad(fmt.Sprintf("%s %s is there %d times", t.Key, key, n))
		}
	}
	if err := <-done; err != nil {
		return nil, fmt.Errorf("read %s: %w", t.Name, err)
	}
	for key, got := range seen {
		r.foreign += int64(len(got))
		r.bad(fmt.Sprintf("%s %s in %s is no row of the table", t.Key, key, files[got[0].file]))
	}
	return r, nil
}
