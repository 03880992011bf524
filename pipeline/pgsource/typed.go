package pgsource

import (
	"bytes"
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// Decoder turns a record's Value (a row in COPY text format, as a
// [Source] emits it) into typed Go values, by pgx's type map: what a
// library user gets from pgx.Rows.Values. [Fields] gives the same row as
// text (the command prints that).
//
// A value is nil for NULL, else what pgx decodes the column's type to:
// int16/int32/int64, float32/float64, string, bool, time.Time,
// pgtype.Numeric, [16]byte (uuid), []byte (bytea), the unmarshalled JSON
// (json, jsonb), []any (arrays), and so on. A domain decodes as its base
// type; a type pgx does not know (an enum, a user's own type) as its text.
type Decoder struct {
	table string
	names []string
	oids  []uint32
	m     *pgtype.Map
}

// NewDecoder returns the decoder of t's rows, looking up its columns'
// types on c.
func NewDecoder(ctx context.Context, c *pgx.Conn, t *Table) (*Decoder, error) {
	d := &Decoder{table: t.Name, m: pgtype.NewMap()}
	for _, k := range t.Columns {
		var oid uint32
		err := c.QueryRow(ctx, `SELECT coalesce(nullif(ty.typbasetype, 0), a.atttypid) FROM pg_attribute a
			JOIN pg_type ty ON ty.oid = a.atttypid
			WHERE a.attrelid = $1::regclass AND a.attname = $2 AND NOT a.attisdropped`, t.Name, k.Name).Scan(&oid)
		if err != nil {
			return nil, fmt.Errorf("pgsource: the type of column %q of table %s: %w", k.Name, t.Name, err)
		}
		d.names = append(d.names, k.Name)
		d.oids = append(d.oids, oid)
	}
	return d, nil
}

// Decoder is [NewDecoder] for the source's table, over a connection of
// its own.
func (s *Source) Decoder(ctx context.Context) (*Decoder, error) {
	c, err := pgx.ConnectConfig(ctx, s.cfg)
	if err != nil {
		return nil, fmt.Errorf("pgsource: connect to %s:%d: %w", s.cfg.Host, s.cfg.Port, err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	return NewDecoder(ctx, c, s.table)
}

// Columns are the names of the values Decode returns, in order.
func (d *Decoder) Columns() []string { return d.names }

// Decode returns the row's values, in the order of Columns.
func (d *Decoder) Decode(value []byte) ([]any, error) {
	out := make([]any, 0, len(d.oids))
	for f := range bytes.SplitSeq(value, []byte{'\t'}) {
		i := len(out)
		if i >= len(d.oids) {
			return nil, fmt.Errorf("pgsource: table %s: a row of more than the %d columns read: decode rows with the decoder of the source that read them", d.table, len(d.oids))
		}
		if string(f) == `\N` {
			out = append(out, nil)
			continue
		}
		text := []byte(unescape(f))
		typ, ok := d.m.TypeForOID(d.oids[i])
		if !ok {
			out = append(out, string(text))
			continue
		}
		v, err := typ.Codec.DecodeValue(d.m, d.oids[i], pgtype.TextFormatCode, text)
		if err != nil {
			return nil, fmt.Errorf("pgsource: table %s, column %q (%s): decode %q: %w", d.table, d.names[i], typ.Name, text, err)
		}
		out = append(out, v)
	}
	if len(out) != len(d.oids) {
		return nil, fmt.Errorf("pgsource: table %s: a row of %d columns, and %d were read: decode rows with the decoder of the source that read them", d.table, len(out), len(d.oids))
	}
	return out, nil
}

// DecodeMap is Decode by column name.
func (d *Decoder) DecodeMap(value []byte) (map[string]any, error) {
	vs, err := d.Decode(value)
	if err != nil {
		return nil, err
	}
	m := make(map[string]any, len(vs))
	for i, v := range vs {
		m[d.names[i]] = v
	}
	return m, nil
}
