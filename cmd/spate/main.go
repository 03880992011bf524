package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
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
		{"backfill", "copy every line of a directory's files into another, coordinated across processes", runBackfill},
		{"demo", "run a self-contained fleet demo: workers, a killed worker, takeover, verification", runDemo},
		{"inspect", "show a job's plan, members and splits", runInspect},
		{"requeue", "put a quarantined split back into play", runRequeue},
		{"verify", "check that every input line of a backfill reached its output", runVerify},
		{"conformance", "run the store conformance suite against a live store", runConformance},
	}
}

func main() {
	os.Exit(run(os.Args[1:]))
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
	fmt.Fprintln(w, "Run 'spate COMMAND -h' for a command's flags. Start with: spate demo")
}

// newFlagSet makes a command's flag set with a usage line.
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
// the exit code.
func parseArgs(fs *flag.FlagSet, args []string) (pos []string, code int, ok bool) {
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, exitOK, false
			}
			return nil, exitUsage, false
		}
		if fs.NArg() == 0 {
			return pos, 0, true
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
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
// log writer on a terminal).
func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", l.level)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch strings.ToLower(l.format) {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", l.format)
}

// fail prints an error for the user and returns the exit code.
func fail(code int, format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "spate: "+format+"\n", args...)
	return code
}
