package humanize

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 49386224: "47.1 MiB", 1 << 40: "1.0 TiB"} {
		assert.Equal(t, want, Bytes(n), "%d", n)
	}
}
