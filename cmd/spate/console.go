package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// console owns the process's human output. Event lines go to stdout with the
// run's elapsed time in front. On a terminal it also keeps a status line (the
// progress bar) at the bottom: event lines and log records (stderr) are
// written above it, and it is redrawn after them.
type console struct {
	mu     sync.Mutex
	out    io.Writer
	errOut io.Writer
	tty    bool
	quiet  bool
	start  time.Time
	status string
}

func newConsole(quiet bool) *console {
	return &console{out: os.Stdout, errOut: os.Stderr, tty: isTerminal(os.Stdout), quiet: quiet, start: time.Now()}
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

const clearLine = "\r\033[K"

// event prints an event line ("  12.3s message"), unless quiet.
func (c *console) event(format string, args ...any) {
	if c.quiet {
		return
	}
	c.line(format, args...)
}

// line prints a line even when quiet (results, summaries).
func (c *console) line(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clearStatusLocked()
	fmt.Fprintf(c.out, "%7.1fs  %s\n", time.Since(c.start).Seconds(), msg)
	c.drawStatusLocked()
}

// plain prints text as is (tables, summaries).
func (c *console) plain(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clearStatusLocked()
	fmt.Fprintf(c.out, format, args...)
	c.drawStatusLocked()
}

// setStatus replaces the status line (terminal only).
func (c *console) setStatus(s string) {
	if !c.tty {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.status = s
	c.clearStatusLocked()
	c.drawStatusLocked()
}

// endStatus removes the status line for good.
func (c *console) endStatus() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clearStatusLocked()
	c.status = ""
}

func (c *console) clearStatusLocked() {
	if c.tty && c.status != "" {
		io.WriteString(c.out, clearLine)
	}
}

func (c *console) drawStatusLocked() {
	if c.tty && c.status != "" {
		io.WriteString(c.out, c.status)
	}
}

// logWriter is where log records go: stderr, written above the status line.
func (c *console) logWriter() io.Writer { return consoleLog{c} }

type consoleLog struct{ c *console }

func (l consoleLog) Write(p []byte) (int, error) {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	l.c.clearStatusLocked()
	n, err := l.c.errOut.Write(p)
	l.c.drawStatusLocked()
	return n, err
}

// bar renders a progress bar of width cells for fraction f.
func bar(f float64, width int) string {
	f = min(max(f, 0), 1)
	full := int(f * float64(width))
	return "[" + strings.Repeat("#", full) + strings.Repeat("-", width-full) + "]"
}

// bytesStr renders a byte count with a binary unit.
func bytesStr(n int64) string {
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

// count renders an integer with thousands separators.
func count(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// rate renders n per elapsed second.
func rate(n int64, elapsed time.Duration) float64 {
	if elapsed <= 0 {
		return 0
	}
	return float64(n) / elapsed.Seconds()
}
