package spate_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/driver"
)

func TestErrorClasses(t *testing.T) {
	fenced := spate.Fencedf("split %s is owned by a peer at epoch %d", "s-0", 2)
	assert.True(t, spate.IsFenced(fenced))
	assert.True(t, errors.Is(fenced, spate.ErrFenced), "a fenced error matches ErrFenced")
	assert.False(t, errors.Is(fenced, spate.ErrFatal), "a fenced error matches ErrFenced only")
	assert.Contains(t, fenced.Error(), "owned by a peer", "error text keeps the reason")
	assert.True(t, spate.IsRetryable(spate.Retryablef("timeout")))
	assert.True(t, spate.IsFatal(spate.Fatalf("no CAS")))
	// class is the one predicate of the three that holds ("" for none).
	class := func(err error) string {
		var held []string
		for name, is := range map[string]func(error) bool{"fenced": spate.IsFenced, "retryable": spate.IsRetryable, "fatal": spate.IsFatal} {
			if is(err) {
				held = append(held, name)
			}
		}
		require.LessOrEqual(t, len(held), 1, "%v is %v at once", err, held)
		if len(held) == 0 {
			return ""
		}
		return held[0]
	}
	cases := []struct {
		err  error
		want string
	}{
		{nil, ""},
		{fmt.Errorf("etcd: put %q: %w: %w", "k", errors.New("io"), spate.ErrRetryable), "retryable"},
		{fmt.Errorf("nats: %w: %w", errors.New("bad creds"), spate.ErrFatal), "fatal"},
		{fmt.Errorf("wrapped: %w", spate.Fencedf("x")), "fenced"},
		{context.Canceled, "retryable"},
		{fmt.Errorf("op: %w", context.DeadlineExceeded), "retryable"},
		{errors.New("unclassified"), "fatal"},
		{driver.ClosedError("mem"), "fatal"},
	}
	for _, c := range cases {
		got := class(c.err)
		assert.Equal(t, c.want, got, "class of %v = %q, want %q", c.err, got, c.want)
	}
	wrapped := spate.Retryablef("store unreachable: %w", context.DeadlineExceeded)
	assert.ErrorIs(t, wrapped, context.DeadlineExceeded, "a %%w cause must stay reachable: %v", wrapped)
	assert.ErrorIs(t, wrapped, spate.ErrRetryable, "a %%w cause must stay reachable: %v", wrapped)
}
