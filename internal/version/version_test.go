package version

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestOlder(t *testing.T) {
	for _, tc := range []struct {
		v, min string
		old    bool
		bad    bool
	}{
		{"4.0.14", "5.0.0", true, false},
		{"5.0.0", "5.0.0", false, false},
		{"5.0", "5.0.0", false, false},
		{"7.0.15", "5.0.0", false, false},
		{"v2.11.3", "2.11.0", false, false},
		{"2.10.22", "2.11.0", true, false},
		{"2.12.0-RC.1", "2.11.0", false, false},
		{"2.11.0+build.5", "2.11.0", false, false},
		{"3.4.27", "3.5.0", true, false},
		{"3.10.0", "3.5.0", false, false},
		{"255.255.255", "5.0.0", false, false},
		{"", "5.0.0", false, true},
		{"seven", "5.0.0", false, true},
		{"7", "5.0.0", false, true},
		{"1.2.3.4", "5.0.0", false, true},
		{"1.-2", "5.0.0", false, true},
	} {
		old, err := Older(tc.v, tc.min)
		if tc.bad {
			assert.Error(t, err, "Older(%q, %q) = %v, %v; want an error", tc.v, tc.min, old, err)
			continue
		}
		if assert.NoError(t, err, "Older(%q, %q)", tc.v, tc.min) {
			assert.Equal(t, tc.old, old, "Older(%q, %q)", tc.v, tc.min)
		}
	}
}
