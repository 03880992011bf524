package main

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/spate-go/spate/internal/humanize"
)

// console owns the process's human output. Event lines go to stdout with the
// run's elapsed time in front. On a terminal it also keeps a status line (the
// progress bar) at the bottom: event lines and log records (stderr) are
// written above it, and it is redrawn after them. The status line is cut to
// the terminal's width, so that it never wraps: a wrapped line leaves its
// first rows behind on every redraw.
type console struct {
	mu     sync.Mutex
	out    io.Writer
	errOut io.Writer
	tty    bool
	quiet  bool
	start  time.Time
	status string
	// width is the terminal's width in columns (0: unknown), asked at every
	// redraw so that a resized window is followed.
	width func() int
	// drawn is the width of the status line on screen, 0 when none is.
	drawn int
}

func newConsole(quiet bool) *console {
	return &console{out: os.Stdout, errOut: os.Stderr, tty: isTerminal(os.Stdout), quiet: quiet, start: time.Now(),
		width: func() int { return terminalWidth(os.Stdout) }}
}

// isTerminal reports whether f is a character device (a terminal).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// defaultWidth is assumed when the terminal's width is unknown.
const defaultWidth = 80

// columns is the terminal's width, or defaultWidth when unknown.
func (c *console) columns() int {
	if c.width != nil {
		if w := c.width(); w > 0 {
			return w
		}
	}
	return defaultWidth
}

// columnsEnv is $COLUMNS, 0 when unset or not a positive number.
func columnsEnv() int {
	n, err := strconv.Atoi(strings.TrimSpace(os.Getenv("COLUMNS")))
	if err != nil || n <= 0 {
		return 0
	}
	return n
}

// fitWidth cuts s to at most width-1 columns (the last column is left
// free: some terminals wrap on writing it). Every rune counts one column.
func fitWidth(s string, width int) string {
	limit := max(width-1, 1)
	if utf8.RuneCountInString(s) <= limit {
		return s
	}
	r := []rune(s)
	if limit <= 1 {
		return string(r[:limit])
	}
	return string(r[:limit-1]) + "…"
}

const (
	clearLine     = "\r\033[K"     // to the line's start, and erase it
	cursorUpClear = "\033[A\033[K" // up one row, and erase it
)

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

// clearStatusLocked erases the status line on screen: every row of it, if
// the window was narrowed under it since it was drawn and it now wraps.
func (c *console) clearStatusLocked() {
	if !c.tty || c.drawn == 0 {
		return
	}
	rows := (c.drawn + c.columns() - 1) / c.columns()
	io.WriteString(c.out, clearLine+strings.Repeat(cursorUpClear, max(rows-1, 0)))
	c.drawn = 0
}

func (c *console) drawStatusLocked() {
	if c.tty && c.status != "" {
		s := fitWidth(c.status, c.columns())
		io.WriteString(c.out, s)
		c.drawn = utf8.RuneCountInString(s)
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

// progressStatus is the progress bar's status line for a terminal width
// columns wide: a bar, then as many of the percentage, the split count,
// the committed bytes and this worker's rate as fit; the bar takes the
// room left, between 10 and 30 cells.
//
// amount renders the job's done and total: bytes of files, rows of a
// table (input.amount).
func progressStatus(width int, frac float64, s jobSummary, here string, amount func(int64) string) string {
	const minBar, maxBar = 10, 30
	parts := []string{fmt.Sprintf("%3.0f%%", 100*min(max(frac, 0), 1)),
		fmt.Sprintf("%d/%d splits", s.completed, s.splits),
		fmt.Sprintf("%s/%s", strings.TrimSuffix(amount(s.done), " rows"), amount(s.total)), here}
	avail := width - 1
	for n := len(parts); n >= 1; n-- {
		tail := strings.Join(parts[:n], "  ")
		if room := avail - utf8.RuneCountInString(tail) - 3; room >= minBar { // 3: the brackets and a space
			return bar(frac, min(room, maxBar)) + " " + tail
		}
	}
	return fitWidth(parts[0]+" "+parts[1], width)
}

// bar renders a progress bar of width cells for fraction f.
func bar(f float64, width int) string {
	f = min(max(f, 0), 1)
	full := int(f * float64(width))
	return "[" + strings.Repeat("#", full) + strings.Repeat("-", width-full) + "]"
}

// bytesStr renders a byte count with a binary unit.
var bytesStr = humanize.Bytes

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
