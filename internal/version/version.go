// Package version compares the dotted release numbers servers report
// ("7.0.15", "v2.11.3", "3.6.0-rc.1") against a driver's minimum.
package version

import (
	"fmt"
	"strconv"
	"strings"
)

// Parse reads major.minor[.patch] with an optional leading 'v'; anything
// after '-', '+' or a space (pre-release, build metadata) is ignored.
func Parse(v string) ([3]int, error) {
	var out [3]int
	s := strings.TrimPrefix(strings.TrimSpace(v), "v")
	if i := strings.IndexAny(s, "-+ "); i >= 0 {
		s = s[:i]
	}
	parts := strings.Split(s, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return out, fmt.Errorf("version %q is not major.minor[.patch]", v)
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 {
			return out, fmt.Errorf("version %q is not major.minor[.patch]", v)
		}
		out[i] = n
	}
	return out, nil
}

// Older reports whether v is an earlier release than min. Both must parse.
func Older(v, min string) (bool, error) {
	a, err := Parse(v)
	if err != nil {
		return false, err
	}
	b, err := Parse(min)
	if err != nil {
		return false, err
	}
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i], nil
		}
	}
	return false, nil
}
