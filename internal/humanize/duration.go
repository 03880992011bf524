package humanize

import (
	"fmt"
	"time"
)

// Duration renders a duration as an operator reads an ETA or an age:
// rounded to the unit that matters, two units at most, the second one
// zero-padded so that a column of them lines up. "<1s" for anything under
// a second (milliseconds are noise on a progress display), "12s",
// "3m05s", "2h05m", "3d04h"; "0s" for zero or less.
func Duration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return "<1s"
	}
	if s := d.Round(time.Second); s < time.Hour {
		if s < time.Minute {
			return fmt.Sprintf("%ds", int(s/time.Second))
		}
		return fmt.Sprintf("%dm%02ds", int(s/time.Minute), int(s%time.Minute/time.Second))
	}
	if m := d.Round(time.Minute); m < 24*time.Hour {
		return fmt.Sprintf("%dh%02dm", int(m/time.Hour), int(m%time.Hour/time.Minute))
	}
	h := d.Round(time.Hour)
	return fmt.Sprintf("%dd%02dh", int(h/(24*time.Hour)), int(h%(24*time.Hour)/time.Hour))
}
