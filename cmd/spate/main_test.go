package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/spate-go/spate/internal/etcdservers"
	"github.com/spate-go/spate/internal/pgservers"
)

// spateBin is the real binary the tests run, built once by TestMain (with
// -race when the tests run with it).
var spateBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "spate-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	spateBin = filepath.Join(dir, "spate")
	args := []string{"build", "-o", spateBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build the spate binary: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := pgservers.Main(m) // runs the tests, then stops the PostgreSQL server they shared
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(etcdservers.LeakIgnores()...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines leaked after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// output is a concurrency-safe buffer that wakes waiters on every write.
type output struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

func newOutput() *output { return &output{changed: make(chan struct{})} }

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	n, err := o.buf.Write(p)
	close(o.changed)
	o.changed = make(chan struct{})
	return n, err
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// waitFor waits until the output holds substr, the process exits, or the
// timeout passes.
func (o *output) waitFor(t *testing.T, p *proc, substr string, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		o.mu.Lock()
		has := strings.Contains(o.buf.String(), substr)
		ch := o.changed
		o.mu.Unlock()
		if has {
			return
		}
		select {
		case <-ch:
		case <-p.done:
			out := o.String()
			require.Contains(t, out, substr, "spate exited (%v) before printing %q:\n%s\nstderr:\n%s", p.err, substr, out, p.stderr.String())
			return
		case <-deadline.C:
			t.Fatalf("no %q within %v:\n%s\nstderr:\n%s", substr, timeout, o.String(), p.stderr.String())
		}
	}
}

// proc is a running spate process.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *output
	done           chan struct{}
	err            error
}

// start runs the binary in dir with args; stdin is fed from the string.
func start(t *testing.T, dir, stdin string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(spateBin, args...)
	cmd.Dir = dir
	p := &proc{cmd: cmd, stdout: newOutput(), stderr: newOutput(), done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.stdout, p.stderr
	cmd.Stdin = strings.NewReader(stdin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	require.NoError(t, cmd.Start(), "start spate")
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Fatalf("spate %s did not exit within %v:\n%s\nstderr:\n%s", strings.Join(p.cmd.Args[1:], " "), timeout, p.stdout.String(), p.stderr.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

// runSpate runs the binary to completion and returns its exit code and output.
func runSpate(t *testing.T, dir, stdin string, timeout time.Duration, args ...string) (int, string, string) {
	t.Helper()
	p := start(t, dir, stdin, args...)
	code := p.wait(t, timeout)
	return code, p.stdout.String(), p.stderr.String()
}

// expectCode fails t unless code is want, showing the output.
func expectCode(t *testing.T, what string, code, want int, stdout, stderr string) {
	t.Helper()
	require.Equal(t, want, code, "%s: exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", what, code, want, stdout, stderr)
}

// writeCorpus writes files*lines lines under dir and returns the line count.
func writeCorpus(t *testing.T, dir string, files, lines int) int {
	t.Helper()
	n := 0
	for i := range files {
		var b strings.Builder
		for j := range lines {
			fmt.Fprintf(&b, "file %02d line %05d %s\n", i, j, strings.Repeat("z", j%37))
			n++
		}
		p := filepath.Join(dir, fmt.Sprintf("part-%d", i%3), fmt.Sprintf("f%02d.txt", i))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(b.String()), 0o644))
	}
	return n
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
