package pgsink_test

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate/pipeline/pgsink"
)

// Workers of a fleet start at once, and each sink creates the fence table
// if it is absent: concurrent creations all succeed (PostgreSQL's CREATE
// TABLE IF NOT EXISTS alone can fail one of them on a unique violation in
// its catalog).
func TestConcurrentSinksCreateTheFenceTable(t *testing.T) {
	for round := range 5 {
		url, c := newDB(t)
		exec(t, c, "CREATE TABLE dest (id bigint, body text)")
		const n = 8
		errs := make([]error, n)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				s, err := pgsink.New(context.Background(), pgsink.Options{URL: url, Table: "dest", Job: "job"})
				if err == nil {
					_ = s.Close()
				}
				errs[i] = err
			})
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "round %d, sink %d", round, i)
		}
	}
}
