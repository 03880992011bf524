package mem_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/storeurl"
	"github.com/spate-go/spate/storeurl/storeurltest"
)

func TestURLDeployment(t *testing.T) {
	storeurltest.Run(t, "mem://", storeurl.Options{}, time.Second)
}

// mem:// is in-process: each Open is a new deployment; within one, every
// store over a job shares its data and its TTL; deleting the job reaches
// the stores still open over it, as a server's delete would.
func TestURLDeploymentSharesAJobsData(t *testing.T) {
	ctx := t.Context()
	d, err := storeurl.Open(ctx, "mem://", storeurl.Options{})
	require.NoError(t, err)
	defer d.Close()
	assert.True(t, d.Info().InProcess)
	s1, err := d.Open(ctx, "j", time.Second)
	require.NoError(t, err)
	defer s1.Close()
	s2, err := d.Open(ctx, "j", time.Second)
	require.NoError(t, err)
	defer s2.Close()
	_, err = s1.Create(ctx, spate.Durable, "k", []byte("v"))
	require.NoError(t, err)
	_, found, err := s2.Get(ctx, spate.Durable, "k")
	require.NoError(t, err)
	assert.True(t, found)
	_, err = d.Open(ctx, "j", 2*time.Second)
	assert.ErrorIs(t, err, spate.ErrFatal, "another TTL for the same job")

	other, err := storeurl.Open(ctx, "mem://", storeurl.Options{})
	require.NoError(t, err)
	defer other.Close()
	ok, err := other.JobExists(ctx, "j")
	require.NoError(t, err)
	assert.False(t, ok, "two mem:// deployments share a job")

	require.NoError(t, d.DeleteJob(ctx, "j"))
	_, found, err = s2.Get(ctx, spate.Durable, "k")
	require.NoError(t, err)
	assert.False(t, found, "a store open over the deleted job still sees its key")

	for _, bad := range []string{"mem://host", "mem://?x=1", "mem:///path"} {
		_, err := storeurl.Open(ctx, bad, storeurl.Options{})
		assert.ErrorIs(t, err, spate.ErrFatal, bad)
	}
}
