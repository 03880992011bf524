// Package humanize renders quantities as operators read them, for the
// command's console and the job view alike.
package humanize

import "fmt"

// Bytes renders a byte count with a binary unit: 512 B, 1.5 KiB, 47.1 MiB.
func Bytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
