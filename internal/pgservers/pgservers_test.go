package pgservers

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// TestServerServesFreshDatabases: the shared server runs, as a non-root
// user, and each NewDB is a database of its own.
func TestServerServesFreshDatabases(t *testing.T) {
	s := Shared(t)
	ctx := context.Background()
	a, b := s.NewDB(t), s.NewDB(t)
	require.NotEqual(t, a, b)
	c, err := pgx.Connect(ctx, a)
	require.NoError(t, err)
	defer c.Close(ctx)
	_, err = c.Exec(ctx, "CREATE TABLE x (id int)")
	require.NoError(t, err)
	var superuser bool
	require.NoError(t, c.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&superuser))
	require.True(t, superuser)
	c2, err := pgx.Connect(ctx, b)
	require.NoError(t, err)
	defer c2.Close(ctx)
	var n int
	require.NoError(t, c2.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'x'").Scan(&n))
	require.Equal(t, 0, n, "a fresh database must not see another's tables")
	require.Same(t, s, Shared(t), "one server per package")
}
