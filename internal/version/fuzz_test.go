package version

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Any server-reported string parses or errors; a parsed version compares
// equal to itself and consistently with its own re-rendering.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"7.0.15", "v2.11.3", "3.6.0-rc.1", "", "1.2.3.4", "99999999999999999999.1", "2.x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := Parse(s)
		if err != nil {
			return
		}
		old, err := Older(s, s)
		require.NoError(t, err, "Older(%q, itself)", s)
		require.False(t, old, "Older(%q, itself)", s)
		for _, n := range v {
			require.GreaterOrEqual(t, n, 0, "negative part in %q: %v", s, v)
		}
	})
}
