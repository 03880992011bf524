package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"

	"github.com/spate-go/spate/stores/redis"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailed  = 1 // an error, a failed check, a failed verification
	exitUsage   = 2 // bad flags or arguments
	exitStalled = 3 // the job cannot finish: quarantined splits
	// An interrupted run exits 128 + the signal number (130 for SIGINT,
	// 143 for SIGTERM) after its graceful drain.
)

type command struct {
	name    string
	summary string
	run     func(args []string) int
}

var commands []command

func init() {
	commands = []command{
		{"backfill", "copy every line of a directory's files (or every row of a table) into another, coordinated across processes", runBackfill},
		{"demo", "run a self-contained fleet demo: workers, a killed worker, takeover, verification", runDemo},
		{"inspect", "show a job's plan, members and splits", runInspect},
		{"jobs", "list the jobs on a store", runJobs},
		{"ui", "serve a live view of a store's jobs in the browser (read-only)", runUI},
		{"requeue", "put a quarantined split back into play", runRequeue},
		{"delete", "delete a job's keys from its store (not while workers run it, unless --force)", runDelete},
		{"verify", "check that every input line (or table row) of a backfill reached its output", runVerify},
		{"conformance", "run the store conformance suite against a live store", runConformance},
	}
}

func main() {
	os.Exit(withProfiles(func() int { return run(os.Args[1:]) }))
}

func run(args []string) int {
	if len(args) == 0 {
		usage(os.Stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(os.Stdout)
		return exitOK
	case "-version", "--version", "version":
		fmt.Println(versionString())
		return exitOK
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(args[1:])
		}
	}
	fmt.Fprintf(os.Stderr, "spate: unknown command %q\n\n", args[0])
	usage(os.Stderr)
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "spate: distributed work coordination: a coordinated backfill and the tools to operate it")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: spate COMMAND [flags]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-12s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'spate COMMAND -h' for a command's flags, 'spate --version' for the build. Start with: spate demo")
}

// version is the release, when the build sets it:
// go build -ldflags "-X main.version=v1.2.3" ./cmd/spate. Otherwise
// versionString reads the module version and VCS stamp the Go toolchain
// records in the binary.
var version string

// versionString is what spate --version prints: the version, the commit
// it was built from when known, and the Go toolchain and platform.
func versionString() string {
	v := version
	var rev, when string
	modified := false
	if info, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	if v == "" || v == "(devel)" {
		v = "devel"
	}
	out := "spate " + v
	if rev != "" {
		var parts []string
		parts = append(parts, "commit "+rev[:min(12, len(rev))])
		if when != "" {
			parts = append(parts, when)
		}
		if modified {
			parts = append(parts, "modified")
		}
		out += " (" + strings.Join(parts, ", ") + ")"
	}
	return out + " " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
}

// newFlagSet makes a command's flag set with a usage line. Its Usage
// prints the whole help; parseArgs prints it only for -h.
func newFlagSet(name, args, about string) *flag.FlagSet {
	fs := flag.NewFlagSet("spate "+name, flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: spate %s %s\n\n%s\n\nFlags:\n", name, args, about)
		fs.PrintDefaults()
	}
	return fs
}

// parseArgs parses flags that may come before, between or after positional
// arguments (stdlib flag stops at the first positional one) and returns the
// positional arguments. ok is false after a parse error or -h; code is then
// the exit code. -h prints the command's help on stdout; a bad flag prints
// one line naming it on stderr, not the whole help.
func parseArgs(fs *flag.FlagSet, args []string) (pos []string, code int, ok bool) {
	help := fs.Usage
	fs.Usage = func() {}
	fs.SetOutput(io.Discard) // the error is printed below, in one line
	defer func() {
		fs.Usage = help
		fs.SetOutput(nil)
	}()
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(os.Stdout)
				help()
				return nil, exitOK, false
			}
			return nil, usageError(fs, "%v", err), false
		}
		if fs.NArg() == 0 {
			return pos, 0, true
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// usageError prints a one-line usage error of fs's command, with where to
// find its flags, and returns exitUsage.
func usageError(fs *flag.FlagSet, format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "%s: %s (see %s -h)\n", fs.Name(), plainMessage(fmt.Sprintf(format, args...)), fs.Name())
	return exitUsage
}

// errorClasses are the markers spate's errors carry for programs
// (errors.Is matches them): "spate: retryable: reason" from
// spate.Retryablef, "...: spate: retryable" from a driver wrapping the
// class.
var errorClasses = []string{"spate: fatal", "spate: retryable", "spate: fenced"}

// plainMessage is msg for people: without the error-class markers, which
// say how a program must react, not what went wrong.
func plainMessage(msg string) string {
	for _, c := range errorClasses {
		msg = strings.ReplaceAll(msg, c+": ", "")
		msg = strings.ReplaceAll(msg, ": "+c, "")
	}
	return msg
}

// logFlags are every command's logging flags.
type logFlags struct {
	format string
	level  string
}

func (l *logFlags) register(fs *flag.FlagSet, defLevel string) {
	fs.StringVar(&l.format, "log-format", "text", "log format on stderr: text or json")
	fs.StringVar(&l.level, "log-level", defLevel, "log level: debug, info, warn or error")
}

// logger builds the slog logger, writing to w (stderr, or the console's
// log writer on a terminal). go-redis's own log lines go through it too.
func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	if err := l.validate(); err != nil {
		return nil, err
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(l.level))
	opts := &slog.HandlerOptions{Level: level}
	var log *slog.Logger
	if strings.EqualFold(l.format, "json") {
		log = slog.New(slog.NewJSONHandler(w, opts))
		failLog.Store(log) // every command logs to stderr: its final error is a JSON record too
	} else {
		log = slog.New(slog.NewTextHandler(w, opts))
	}
	redis.RouteClientLogs(log)
	return log, nil
}

// validate checks the logging flags.
func (l *logFlags) validate() error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.level)); err != nil {
		return flagErrorf("--log-level %q: want debug, info, warn or error", l.level)
	}
	switch strings.ToLower(l.format) {
	case "text", "json":
		return nil
	}
	return flagErrorf("--log-format %q: want text or json", l.format)
}

// failLog, once a command chose --log-format json for stderr, is the
// logger fail writes through, so that every stderr line is a JSON record.
var failLog atomic.Pointer[slog.Logger]

// fail prints an error for the user and returns the exit code. A message
// that already starts with "spate: " (the library's errors do) keeps one;
// error-class markers are left out (plainMessage).
// Under --log-format json it is an ERROR record with the exit code.
func fail(code int, format string, args ...any) int {
	msg := strings.TrimPrefix(plainMessage(fmt.Sprintf(format, args...)), "spate: ")
	if l := failLog.Load(); l != nil {
		l.Error(msg, "exit_code", code)
		return code
	}
	fmt.Fprintf(os.Stderr, "spate: %s\n", msg)
	return code
}

// randomHex returns 32 random hex digits (128 bits): instance ids and
// scratch namespaces that must not collide.
func randomHex() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}
