package spate

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWarningsAreThrottledPerMessage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		log := slog.New(newThrottle(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}), warnEvery)).With("instance", "w1")
		lines := func() []string { return strings.Split(strings.TrimSpace(buf.String()), "\n") }

		for i := range 1000 {
			log.Warn("split lost", "split", i)
			log.Info("progress", "i", i)
		}
		log.Error("fatal thing")
		log.Warn("another warning")
		got := lines()
		require.Len(t, got, warnBurst+1000+2, "5 copies of the repeated warning, every info, the error and the other warning")
		assert.Contains(t, got[0], "split=0")
		assert.Equal(t, warnBurst, strings.Count(buf.String(), "split lost"))

		buf.Reset()
		time.Sleep(warnEvery)
		log.With("more", 1).Warn("split lost", "split", "late")
		got = lines()
		require.Len(t, got, 1)
		assert.Contains(t, got[0], "split=late")
		assert.Contains(t, got[0], "suppressed=995", "the next copy says how many were held back")
		assert.Contains(t, got[0], "instance=w1")
	})
}
