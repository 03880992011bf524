package pgsource

import (
	"strings"

	"github.com/spate-go/spate"
)

// fingerprintPrefix starts every plan fingerprint of this source.
const fingerprintPrefix = "pgsource:"

// IsFingerprint reports whether fp is the fingerprint of a plan this
// package made (a job reading a table), so that tools can show its splits
// as key ranges.
func IsFingerprint(fp string) bool { return strings.HasPrefix(fp, fingerprintPrefix) }

// KeyRange is the key range of one of the plan's splits: the rows whose key
// is above lo and at most hi, in the key's order; a nil bound is none (the
// first chunk has no lower bound, the last no upper bound).
func KeyRange(spec spate.SplitSpec) (lo, hi *string, err error) {
	ch, err := parseChunk(spec)
	if err != nil {
		return nil, nil, err
	}
	return ch.Lo, ch.Hi, nil
}
