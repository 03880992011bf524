package main

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/internal/pgservers"
)

func TestMain(m *testing.M) { os.Exit(pgservers.Main(m)) }

// The example copies a table exactly once.
func TestCopyTable(t *testing.T) {
	url := pgservers.Shared(t).NewDB(t)
	ctx := context.Background()
	c, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer c.Close(ctx)
	_, err = c.Exec(ctx, `CREATE TABLE events (id bigint PRIMARY KEY, body text);
		INSERT INTO events SELECT i, 'e' || i FROM generate_series(1, 20000) i;
		CREATE TABLE events_copy (LIKE events);`)
	require.NoError(t, err)
	require.NoError(t, copyTable(ctx, "mem://", url, "events", "events_copy"))
	var n, distinct int
	require.NoError(t, c.QueryRow(ctx, "SELECT count(*), count(DISTINCT id) FROM events_copy").Scan(&n, &distinct))
	require.Equal(t, 20000, n)
	require.Equal(t, 20000, distinct)
}
