package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spate-go/spate/pipeline/pgsink"
	"github.com/spate-go/spate/pipeline/pgsource"
	"github.com/spate-go/spate/storeurl"
)

// A --src or --dst of scheme postgres:// (or postgresql://) is a table:
//
//	postgres://[user[:password]@]host[:port]/db?table=NAME[&key=COL][&columns=A,B][&where=EXPR][&chunk_rows=N][&max_row_bytes=N][&password_file=FILE]
//
// spate takes its parameters out of the URL before the driver (pgx) sees
// it; every other parameter (sslmode, application_name, ...) is pgx's. A
// password comes from password_file, else the URL, else $PGPASSWORD or
// ~/.pgpass (read by pgx). No printed form of the URL holds the password
// (redactTableURL).

// tableParams are the parameters spate takes out of a table URL.
var tableParams = []string{"table", "key", "columns", "where", "chunk_rows", "max_row_bytes", "password_file"}

// tableURL is a parsed table URL.
type tableURL struct {
	// conn is the connection URL for pgx: spate's parameters taken out,
	// password_file's password put in. Never printed.
	conn string
	// shown is the URL as given, redacted: what messages and suggested
	// commands show.
	shown string
	// location names the table for the job's identity and its name:
	// postgres://host:port/db?table=NAME, without user info or options.
	location string
	opts     pgsource.Options // the table and how to read it (URL left empty)
}

// isTableURL reports whether s names a PostgreSQL table.
func isTableURL(s string) bool {
	scheme, _, ok := strings.Cut(strings.TrimSpace(s), "://")
	return ok && (strings.EqualFold(scheme, "postgres") || strings.EqualFold(scheme, "postgresql"))
}

// atPastAuthority reports whether raw holds an '@' after its authority
// (in the path, query or fragment): such a URL is ambiguous (a password
// holding an unescaped / ? or # reads as a path), so it is refused, and
// redacted as a whole.
func atPastAuthority(raw string) bool {
	_, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return strings.Contains(raw, "@")
	}
	i := strings.IndexAny(rest, "/?#")
	return i >= 0 && strings.Contains(rest[i:], "@")
}

// redactTableURL is raw with its secrets masked: the password, and the
// value of every driver parameter whose name suggests a secret (as
// storeurl.Redact masks them); spate's own parameters are shown. Text
// that does not parse unambiguously is masked by storeurl.Redact.
func redactTableURL(raw string) string {
	raw = strings.TrimSpace(raw)
	u, err := url.Parse(raw)
	if err != nil || atPastAuthority(raw) || u.Opaque != "" {
		return storeurl.Redact(raw)
	}
	var b strings.Builder
	b.WriteString(u.Scheme + "://")
	if u.User != nil {
		b.WriteString(url.User(u.User.Username()).String())
		if _, ok := u.User.Password(); ok {
			b.WriteString(":xxxxx")
		}
		b.WriteString("@")
	}
	b.WriteString(u.Host)
	b.WriteString(u.EscapedPath())
	if u.RawQuery != "" {
		pairs := strings.Split(u.RawQuery, "&")
		for i, kv := range pairs {
			k, _, _ := strings.Cut(kv, "=")
			if name, err := url.QueryUnescape(k); err != nil || !slices.Contains(tableParams, name) {
				pairs[i] = strings.TrimPrefix(storeurl.Redact("x://h?"+kv), "x://h?")
			}
		}
		b.WriteString("?" + strings.Join(pairs, "&"))
	}
	if u.Fragment != "" || strings.HasSuffix(raw, "#") {
		b.WriteString("#xxxxx")
	}
	return b.String()
}

// parseTableURL parses a table URL given as --src (src) or --dst. Its
// errors show the URL redacted, if at all.
func parseTableURL(raw string, src bool) (*tableURL, error) {
	raw = strings.TrimSpace(raw)
	t := &tableURL{shown: redactTableURL(raw)}
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" {
		return nil, errors.New("it does not parse as a URL: escape reserved characters (/ ? # @ : % and spaces) of the password as %XX, " +
			"or give the password in password_file=FILE, $PGPASSWORD or ~/.pgpass")
	}
	if atPastAuthority(raw) {
		return nil, errors.New("an '@' after the server address is ambiguous (is it part of the password?): escape it as %40, " +
			"or give the password in password_file=FILE, $PGPASSWORD or ~/.pgpass")
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return nil, errors.New("its query does not parse: escape the parameters' values (spaces as %20, & as %26, = as %3D)")
	}
	for _, k := range tableParams {
		if len(q[k]) > 1 {
			return nil, fmt.Errorf("?%s= is given %d times: give it once", k, len(q[k]))
		}
	}
	take := func(k string) string {
		v := q.Get(k)
		q.Del(k)
		return v
	}
	o := pgsource.Options{Table: take("table"), Key: take("key"), Where: take("where")}
	columns, chunkRows, maxRow, pwFile := take("columns"), take("chunk_rows"), take("max_row_bytes"), take("password_file")
	if o.Table == "" {
		return nil, errors.New("no ?table=: name the table (?table=events, or ?table=schema.events)")
	}
	if !src && (o.Key != "" || o.Where != "" || columns != "" || chunkRows != "" || maxRow != "") {
		return nil, errors.New("a destination table takes ?table= and password_file= only: key, columns, where, chunk_rows and max_row_bytes say how --src is read")
	}
	for c := range strings.SplitSeq(columns, ",") {
		if c = strings.TrimSpace(c); c != "" {
			o.Columns = append(o.Columns, c)
		}
	}
	if chunkRows != "" {
		if o.ChunkRows, err = strconv.ParseInt(chunkRows, 10, 64); err != nil || o.ChunkRows < 1 {
			return nil, fmt.Errorf("?chunk_rows=%s: the target rows per chunk (split) must be a positive integer (default %d)", chunkRows, pgsource.DefaultChunkRows)
		}
	}
	if maxRow != "" {
		if o.MaxRowBytes, err = strconv.Atoi(maxRow); err != nil || o.MaxRowBytes < 1 {
			return nil, fmt.Errorf("?max_row_bytes=%s: the longest row read, in bytes, must be a positive integer (default %d)", maxRow, pgsource.DefaultMaxRowBytes)
		}
	}
	if pwFile != "" {
		pw, err := storeurl.Secret{File: pwFile}.Resolve()
		if err != nil {
			return nil, fmt.Errorf("password_file=%s: %v", pwFile, err)
		}
		name := ""
		if u.User != nil {
			name = u.User.Username()
		}
		u.User = url.UserPassword(name, pw)
	}
	u.RawQuery = q.Encode()
	u.Fragment, u.RawFragment = "", ""
	t.conn = u.String()
	t.location = "postgres://" + u.Host + u.EscapedPath() + "?table=" + url.QueryEscape(o.Table)
	t.opts = o
	return t, nil
}

// tableError is a pgsource or pgsink error for the command line: without
// the package's prefix.
func tableError(err error) error {
	msg := err.Error()
	for _, p := range []string{"pgsource: ", "pgsink: "} {
		msg = strings.TrimPrefix(msg, p)
	}
	return errors.New(msg)
}

// tableJob derives a job's name from a table location: the table's name
// and a hash of the location (server, database and table).
func tableJob(location string) string {
	name := location
	if _, q, ok := strings.Cut(location, "?"); ok {
		if v, err := url.ParseQuery(q); err == nil && v.Get("table") != "" {
			name = v.Get("table")
		}
	}
	sum := sha256.Sum256([]byte(location))
	return sanitizeID(name, 40, "table") + "-" + hex.EncodeToString(sum[:4])
}

// tableInput is a --src table.
type tableInput struct {
	url *tableURL
	src *pgsource.Source
}

// openTableInput opens a --src table: it connects and checks the table,
// its key and columns, and the filter (pgsource.New).
func openTableInput(ctx context.Context, raw string) (*input, error) {
	tu, err := parseTableURL(raw, true)
	if err != nil {
		return nil, err
	}
	o := tu.opts
	o.URL = tu.conn
	s, err := pgsource.New(ctx, o)
	if err != nil {
		return nil, tableError(err)
	}
	return &input{location: tu.location, arg: tu.shown, table: &tableInput{url: tu, src: s}, close: s.Close}, nil
}

// tableOutput is a --dst table; sink is set once the job is known
// (openTable).
type tableOutput struct {
	url  *tableURL
	sink *pgsink.Sink
}

// openTable checks the destination table for job, whose rows have the
// source's columns: its shape, the permission to write, and the fence
// table (created if absent, refusing a table that holds another job's
// rows). A flush is given half the lease (pgsink's Options.Lease).
func (o *destination) openTable(ctx context.Context, job string, in *input, lease time.Duration) error {
	if in.table == nil {
		return fmt.Errorf("a table takes a table's rows: --src must be a postgres:// table too (or give --dst a directory or a bucket)")
	}
	s, err := pgsink.New(ctx, pgsink.Options{URL: o.table.url.conn, Table: o.table.url.opts.Table, Job: job, Shape: in.table.src.Table().Columns, Lease: lease})
	if err != nil {
		return tableError(err)
	}
	o.table.sink = s
	return nil
}

// tableSink is the pgsink as a backfill's staging sink (its WriteChunks
// stages the chunks in turn, without copying them into one slice).
type tableSink struct{ *pgsink.Sink }

// argShown is a --src or --dst as messages show it: a table URL with its
// password masked, anything else as given.
func argShown(s string) string {
	if isTableURL(s) {
		return redactTableURL(s)
	}
	return s
}

// checkTable checks the flags that do not go with a table: a table is
// read once, by key (no --follow, no file patterns or file split sizes),
// and a table is written with a table's rows.
func (f *backfillFlags) checkTable(fs *flag.FlagSet) error {
	if isTableURL(f.dst) && !isTableURL(f.src) {
		return flagErrorf("--dst %s is a table, which takes a table's rows: --src must be a postgres:// table too (or give --dst a directory or a bucket)", argShown(f.dst))
	}
	if !isTableURL(f.src) {
		return nil
	}
	for _, name := range []string{"follow", "until-idle", "discover", "include", "exclude", "split-bytes", "split-files", "min-splits", "max-line-bytes"} {
		if explicitlySet(fs, name) {
			return flagErrorf("--%s does not apply to a table --src: a table is read once, in chunks of its key (?chunk_rows=N sets their size, ?where= filters the rows, ?max_row_bytes= caps a row)", name)
		}
	}
	return nil
}

// tablePlanKey tells whether fp is the fingerprint of a table's plan,
// and its key column ("key" when the fingerprint does not say).
func tablePlanKey(fp string) (string, bool) {
	if !pgsource.IsFingerprint(fp) {
		return "", false
	}
	var f struct{ K string }
	if _, js, ok := strings.Cut(strings.TrimPrefix(fp, "pgsource:"), ":"); ok && json.Unmarshal([]byte(js), &f) == nil && f.K != "" {
		return f.K, true
	}
	return "key", true
}
