package filesink

import (
	"hash/crc32"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// Combining two CRCs gives the CRC of the concatenation, and the CRC of a
// range follows from the CRCs of the prefixes that bound it.
func TestCRCCombineAndRange(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := rapid.SliceOf(rapid.Byte()).Draw(t, "a")
		b := rapid.SliceOf(rapid.Byte()).Draw(t, "b")
		ab := append(append([]byte{}, a...), b...)
		ca, cb, cab := crc32.Checksum(a, castagnoli), crc32.Checksum(b, castagnoli), crc32.Checksum(ab, castagnoli)
		require.Equal(t, cab, crcCombine(ca, cb, int64(len(b))))
		require.Equal(t, cb, crcRange(ca, cab, int64(len(a)), int64(len(ab))))
	})
}
