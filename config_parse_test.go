package spate

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// These tests moved here from config_test.go (package spate_test) when
// parseConfig and the renew interval left the API: nothing outside the
// package called them; Config.UnmarshalJSON decodes through parseConfig.

func TestParseConfig(t *testing.T) {
	c, err := parseConfig([]byte(`{"lease_duration":"1.5s","op_timeout":"200ms","rebalance_delay":"none","max_in_flight":3}`))
	require.NoError(t, err)
	require.Equal(t, 1500*time.Millisecond, c.LeaseDuration, "parsed %+v", c)
	require.Equal(t, 200*time.Millisecond, c.OpTimeout, "parsed %+v", c)
	require.Equal(t, NoRebalanceDelay, c.RebalanceDelay, "parsed %+v", c)
	require.Equal(t, 3, c.MaxInFlight, "parsed %+v", c)
	round, err := parseConfig([]byte(c.String()))
	require.NoError(t, err, "round trip")
	require.Equal(t, c, round, "round trip")
	for _, bad := range []string{`{"lease":"1s"}`, `{"lease_duration":"soon"}`, `{"lease_duration":5}`, `{} {}`, `[`} {
		_, err := parseConfig([]byte(bad))
		assert.True(t, IsFatal(err), "parseConfig(%s) = %v, want a Fatal error", bad, err)
	}
}

func TestDefaultRenewBeatIsAThirdOfTheLease(t *testing.T) {
	require.Equal(t, 10*time.Second, deriveTimings(Config{}.WithDefaults()).beat, "renew interval")
}
