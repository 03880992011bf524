// Package storeurltest checks a driver's URL opener and namespace
// operations against a live deployment: the part of a [storeurl.Deployment]
// that the store conformance suite does not cover.
package storeurltest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/storeurl"
)

// Run opens rawURL and checks the deployment's namespace operations over
// two fresh jobs with ephemeral TTL ttl: both are listed and exist once a
// store wrote to them, RecordedTTL reports ttl or nothing, deleting one
// removes every key of it and leaves the other alone, the deleted job can
// start afresh (with another TTL too), and an absent job is neither listed
// nor found, and deletes without error. The description holds no user
// info. Run deletes its jobs at the end.
func Run(t *testing.T, rawURL string, opts storeurl.Options, ttl time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	d, err := storeurl.Open(ctx, rawURL, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	info := d.Info()
	assert.NotEmpty(t, info.Driver)
	assert.NotContains(t, info.Description, "@", "the description shows user info")

	suffix := fmt.Sprintf("%016x", rand.Uint64())[:10]
	a, b, absent := "urltest-a-"+suffix, "urltest-b-"+suffix, "urltest-absent-"+suffix
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		_ = d.DeleteJob(cctx, a)
		_ = d.DeleteJob(cctx, b)
	})
	open := func(job string, ttl time.Duration) spate.Store {
		t.Helper()
		st, err := d.Open(ctx, job, ttl)
		require.NoError(t, err, "open job %s", job)
		return st
	}
	sa, sb := open(a, ttl), open(b, ttl)
	defer sb.Close()
	for _, w := range []struct {
		st spate.Store
		ks spate.Keyspace
	}{{sa, spate.Durable}, {sa, spate.Ephemeral}, {sb, spate.Durable}} {
		o, err := w.st.Create(ctx, w.ks, "k", []byte("v"))
		require.NoError(t, err)
		require.True(t, o.Won)
	}

	jobs, err := d.Jobs(ctx)
	require.NoError(t, err)
	assert.True(t, slices.IsSorted(jobs), "Jobs is not sorted: %v", jobs)
	assert.Contains(t, jobs, a)
	assert.Contains(t, jobs, b)
	assert.NotContains(t, jobs, absent)
	for job, want := range map[string]bool{a: true, b: true, absent: false} {
		ok, err := d.JobExists(ctx, job)
		require.NoError(t, err)
		assert.Equal(t, want, ok, "JobExists(%s)", job)
	}
	if rec, ok, err := d.RecordedTTL(ctx, a); assert.NoError(t, err) && ok {
		assert.Equal(t, ttl, rec, "RecordedTTL")
	}
	_, ok, err := d.RecordedTTL(ctx, absent)
	assert.NoError(t, err)
	assert.False(t, ok, "RecordedTTL of an absent job")

	require.NoError(t, sa.Close())
	require.NoError(t, d.DeleteJob(ctx, a))
	require.NoError(t, d.DeleteJob(ctx, absent), "deleting an absent job")
	ok, err = d.JobExists(ctx, a)
	require.NoError(t, err)
	assert.False(t, ok, "the deleted job still exists")
	jobs, err = d.Jobs(ctx)
	require.NoError(t, err)
	assert.NotContains(t, jobs, a)
	assert.Contains(t, jobs, b)
	_, found, err := sb.Get(ctx, spate.Durable, "k")
	require.NoError(t, err)
	assert.True(t, found, "deleting one job deleted another's key")

	// The deleted job starts afresh, with another TTL if need be.
	ttl2 := 2 * ttl
	if r := info.TTLResolution; r > 0 {
		ttl2 = ttl2.Round(r)
	}
	sa = open(a, ttl2)
	defer sa.Close()
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		es, err := sa.List(ctx, ks, "")
		require.NoError(t, err)
		assert.Empty(t, es, "%v keys survived DeleteJob", ks)
	}
}
