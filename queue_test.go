package spate

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The queue never blocks its sender, however busy the receiver, keeps
// every item in order and coalesces the signals into one.
func TestSignalQueueNeverBlocksTheSender(t *testing.T) {
	m := newSignalQueue[func() error]()
	var got []int
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for i := range 10000 {
			m.put(func() error { got = append(got, i); return nil })
		}
	}()
	select {
	case <-sent:
	case <-time.After(10 * time.Second):
		t.Fatal("the sender blocked on a queue nobody reads")
	}
	assert.Len(t, m.sig, 1, "one pending signal for the whole burst")
	q := m.take()
	require.Len(t, q, 10000)
	for _, f := range q {
		require.NoError(t, f())
	}
	for i, v := range got {
		require.Equal(t, i, v, "items are taken in the order they were put")
	}
	assert.Empty(t, m.take(), "take empties the queue")
}

func TestSignalQueueSignalsAfterTake(t *testing.T) {
	m := newSignalQueue[func() error]()
	m.put(nil)
	<-m.sig
	require.Len(t, m.take(), 1)
	m.put(nil)
	select {
	case <-m.sig:
	default:
		t.Fatal("an item put after the signal was consumed signals again")
	}
}
