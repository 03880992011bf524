// Package pgsource is a PostgreSQL range-scan source: a table read in
// chunks of its key by a fleet of coordinated workers.
//
// Planning (once per job; the plan is final) walks the key column in index
// order and finds each chunk's end by probing,
//
//	SELECT k FROM (SELECT k FROM t WHERE k > $last [AND filter] ORDER BY k LIMIT $chunk) s ORDER BY k DESC LIMIT 1
//
// so every chunk holds ChunkRows rows whatever the key's distribution
// (sparse ids, one dense hot range, text, uuids): never equal strides over
// min..max, which leave most chunks empty on real tables. The first chunk
// has no lower bound and the last no upper bound, so no key is outside
// every chunk.
//
// A chunk is one split. Its lane streams it with one statement,
//
//	COPY (SELECT k::text, cols FROM t WHERE k > lo AND k <= hi [AND filter] ORDER BY k) TO STDOUT
//
// (no OFFSET paging), so a chunk is read in one snapshot: a row committed
// by a concurrent writer before the statement started is seen, one
// committed after is not, and an update moving a row's key from an unread
// chunk to a read one can miss it (or read it twice, moved the other way).
// Different chunks are read at different times. One point in time for the
// whole fleet (an exported snapshot) is not offered: the exporting
// transaction would have to stay open in one process for the job's whole
// life, which a fleet built to outlive any of its workers cannot promise.
// Stop writers, or read a replica paused at a point, for a consistent copy.
//
// Watermarks. Offsets are row ordinals within the chunk (split-relative, so
// a watermark is an int64 as the runtime wants); the key of the last
// acknowledged row rides in the split's progress state. A new owner resumes
// with WHERE k > that key and numbers the rows it reads from the committed
// watermark on, so the watermark is, in effect, the last key emitted; a
// lost connection mid-chunk resumes the same way.
//
// Rows: each record's Key is the key's text, its Value the row's selected
// columns in COPY text format (tab-separated, \N for NULL), which
// [pgsink] writes with COPY ... FROM STDIN as is, and [Fields] decodes.
package pgsource

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/spate-go/spate"
)

// DefaultChunkRows is the target chunk size in rows.
const DefaultChunkRows = 100_000

// DefaultMaxRowBytes caps one row's text: a longer row fails its chunk
// (raise [Options.MaxRowBytes]).
const DefaultMaxRowBytes = 1 << 20

// MaxKeyBytes caps a key's text: the key of the last acknowledged row is
// carried in every commit.
const MaxKeyBytes = 1 << 10

// Options say what to read.
type Options struct {
	// URL is the server's connection URL (postgres://user@host:port/db).
	URL string
	// Table is the table, optionally schema-qualified ("events",
	// "app.events").
	Table string
	// Key is the column to range over: integer, text or uuid, unique and
	// not null. Default: the table's primary key (which must be one column).
	Key string
	// Columns are the columns read, in order. Default: all of them.
	Columns []string
	// Where is an optional filter, an SQL boolean expression over the
	// table's columns (without the WHERE). It is part of the job: every
	// worker must give the same one.
	Where string
	// ChunkRows is the target rows per chunk (split). Default
	// [DefaultChunkRows].
	ChunkRows int64
	// MaxRowBytes caps one row's text. Default [DefaultMaxRowBytes].
	MaxRowBytes int
	// PackRows makes a record carry many rows (up to about a megabyte):
	// its Value is their lines in COPY text format joined by '\n', its Key
	// their keys joined by '\n' (in the same order), and its Offset the
	// last row's ordinal. A table-to-table copy into pgsink takes records
	// so, and the runtime then handles a record per batch of rows, not
	// one per row. Default: a record per row.
	PackRows bool
}

// Column is one column of a table.
type Column struct {
	Name string
	// Type is the column's type as format_type prints it
	// ("bigint", "character varying(20)").
	Type string
}

// Table is a table introspected for reading: what [New] checked.
type Table struct {
	// Name is the table's schema-qualified, quoted name.
	Name string
	// Key is the key column's name and KeyType its type.
	Key, KeyType string
	// Columns are the columns read, in order.
	Columns []Column
}

// rangeable are the key types a chunk can range over: their order is the
// index's, and their text casts back to them exactly.
var rangeable = []string{"smallint", "integer", "bigint", "text", "character varying", "uuid"}

func connConfig(url string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("pgsource: the connection URL does not parse (pgx redacts its password): %w", err)
	}
	// Literals in COPY statements are quoted for it.
	cfg.RuntimeParams["standard_conforming_strings"] = "on"
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "spate"
	}
	return cfg, nil
}

// Connect opens one connection with the package's settings.
func Connect(ctx context.Context, url string) (*pgx.Conn, error) {
	cfg, err := connConfig(url)
	if err != nil {
		return nil, err
	}
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgsource: connect to %s:%d: %w", cfg.Host, cfg.Port, err)
	}
	return c, nil
}

// Describe introspects the table o names and checks it can be read: it
// exists and may be selected, the key is one rangeable, unique, not-null
// column, and the columns exist.
func Describe(ctx context.Context, c *pgx.Conn, o Options) (*Table, error) {
	if o.Table == "" {
		return nil, errors.New("pgsource: no table: set Options.Table (?table= in a URL)")
	}
	var oid uint32
	var name string
	var canSelect bool
	err := c.QueryRow(ctx, `SELECT c.oid, format('%I.%I', n.nspname, c.relname), has_table_privilege(c.oid, 'SELECT')
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`, o.Table).Scan(&oid, &name, &canSelect)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("pgsource: table %q does not exist (or is not on the search path): check the name, schema-qualify it (schema.table), or create it", o.Table)
	}
	if err != nil {
		return nil, fmt.Errorf("pgsource: look up table %q: %w", o.Table, err)
	}
	if !canSelect {
		return nil, fmt.Errorf("pgsource: no SELECT permission on table %s: GRANT SELECT ON %s TO the job's user", name, name)
	}
	t := &Table{Name: name}
	rows, err := c.Query(ctx, `SELECT attname, format_type(atttypid, atttypmod), atttypid::regtype::text, attnotnull
		FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, oid)
	if err != nil {
		return nil, fmt.Errorf("pgsource: columns of %s: %w", name, err)
	}
	type col struct {
		Column
		base    string
		notNull bool
	}
	var all []col
	for rows.Next() {
		var k col
		if err := rows.Scan(&k.Name, &k.Type, &k.base, &k.notNull); err != nil {
			return nil, err
		}
		all = append(all, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pgsource: columns of %s: %w", name, err)
	}
	find := func(n string) (col, bool) {
		for _, k := range all {
			if k.Name == n {
				return k, true
			}
		}
		return col{}, false
	}
	names := func() string {
		var s []string
		for _, k := range all {
			s = append(s, k.Name)
		}
		return strings.Join(s, ", ")
	}
	if len(o.Columns) == 0 {
		for _, k := range all {
			t.Columns = append(t.Columns, k.Column)
		}
	}
	for _, n := range o.Columns {
		k, ok := find(n)
		if !ok {
			return nil, fmt.Errorf("pgsource: table %s has no column %q (Columns): its columns are %s", name, n, names())
		}
		t.Columns = append(t.Columns, k.Column)
	}
	if len(t.Columns) == 0 {
		return nil, fmt.Errorf("pgsource: table %s has no columns to read", name)
	}

	key := o.Key
	if key == "" {
		var pk []string
		err := c.QueryRow(ctx, `SELECT coalesce(array_agg(a.attname ORDER BY k.ord), '{}')
			FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY k(attnum, ord)
			JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
			WHERE i.indrelid = $1 AND i.indisprimary`, oid).Scan(&pk)
		if err != nil {
			return nil, fmt.Errorf("pgsource: primary key of %s: %w", name, err)
		}
		switch {
		case len(pk) == 0:
			return nil, fmt.Errorf("pgsource: table %s has no primary key: set Key (?key= in a URL) to a unique, not-null integer, text or uuid column", name)
		case len(pk) > 1:
			return nil, fmt.Errorf("pgsource: table %s has a composite primary key (%s), and chunks range over one column: set Key (?key= in a URL) to one unique, not-null integer, text or uuid column", name, strings.Join(pk, ", "))
		}
		key = pk[0]
	}
	k, ok := find(key)
	if !ok {
		return nil, fmt.Errorf("pgsource: table %s has no key column %q (Key): its columns are %s", name, key, names())
	}
	if !slices.Contains(rangeable, k.base) {
		return nil, fmt.Errorf("pgsource: the key %s.%s is of type %s, which chunks cannot range over: set Key (?key= in a URL) to an integer, text or uuid column", name, key, k.Type)
	}
	if !k.notNull {
		return nil, fmt.Errorf("pgsource: the key %s.%s may be NULL, and rows with a NULL key would never be read: make it NOT NULL or set Key to another column", name, key)
	}
	var unique bool
	err = c.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		WHERE i.indrelid = $1 AND i.indisunique AND i.indnkeyatts = 1 AND i.indpred IS NULL AND a.attname = $2)`, oid, key).Scan(&unique)
	if err != nil {
		return nil, fmt.Errorf("pgsource: indexes of %s: %w", name, err)
	}
	if !unique {
		return nil, fmt.Errorf("pgsource: the key %s.%s has no unique index of its own, and chunks need unique keys (a resume continues after the last key read): create a unique index on it or set Key to a unique column", name, key)
	}
	t.Key, t.KeyType = key, k.Type
	return t, nil
}

// ident quotes an identifier.
func ident(s string) string { return pgx.Identifier{s}.Sanitize() }

// literal quotes a string constant (standard_conforming_strings on).
func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// keyLit is a key value as a typed constant.
func (t *Table) keyLit(v string) string { return literal(v) + "::" + t.KeyType }

func (t *Table) selectList() string {
	var b strings.Builder
	b.WriteString(ident(t.Key))
	b.WriteString("::text AS spate_key")
	for _, c := range t.Columns {
		b.WriteString(", ")
		b.WriteString(ident(c.Name))
	}
	return b.String()
}

func bounded(conds []string, where string) string {
	if where != "" {
		conds = append(conds, "("+where+")")
	}
	if len(conds) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(conds, " AND ")
}

// checkWhere runs the filter once so that a bad one fails at New, naming
// the table.
func checkWhere(ctx context.Context, c *pgx.Conn, t *Table, where string) error {
	if where == "" {
		return nil
	}
	_, err := c.Exec(ctx, "SELECT 1 FROM "+t.Name+bounded(nil, where)+" LIMIT 0")
	if err != nil {
		return spate.Fatalf("pgsource: the filter (Where) %q on table %s does not run: %v", where, t.Name, err)
	}
	return nil
}
