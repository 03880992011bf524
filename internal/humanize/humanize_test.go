package humanize

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 49386224: "47.1 MiB", 1 << 40: "1.0 TiB"} {
		assert.Equal(t, want, Bytes(n), "%d", n)
	}
}

func TestDuration(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"},
		{0, "0s"},
		{time.Nanosecond, "<1s"},
		{312 * time.Millisecond, "<1s"},
		{999 * time.Millisecond, "<1s"},
		{time.Second, "1s"},
		{1499 * time.Millisecond, "1s"},
		{12*time.Second + 600*time.Millisecond, "13s"},
		{59*time.Second + 600*time.Millisecond, "1m00s"}, // rounded up across a unit
		{3*time.Minute + 5*time.Second, "3m05s"},
		{3*time.Minute + 5*time.Second + 321*time.Millisecond + 987*time.Microsecond, "3m05s"},
		{59*time.Minute + 59*time.Second + 600*time.Millisecond, "1h00m"},
		{2*time.Hour + 5*time.Minute + 29*time.Second, "2h05m"},
		{23*time.Hour + 59*time.Minute + 31*time.Second, "1d00h"},
		{3*24*time.Hour + 4*time.Hour + 10*time.Minute, "3d04h"},
		{400 * 24 * time.Hour, "400d00h"},
	} {
		assert.Equal(t, c.want, Duration(c.d), "%v", c.d)
	}
}
