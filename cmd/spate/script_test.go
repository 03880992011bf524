package main

import (
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"

	"github.com/spate-go/spate/internal/redisservers"
)

var updateScripts = flag.Bool("update-scripts", false, "rewrite the golden files of testdata/script from what the command printed")

// TestScripts runs the command's transcripts in testdata/script: each is
// a txtar script of spate invocations and their exact output, checked
// against golden files (go test -run TestScripts -update-scripts
// ./cmd/spate rewrites them). The binary is the one TestMain built.
// $REDIS is the URL of a redis-server the test started, for scripts that
// need a store another process can read.
func TestScripts(t *testing.T) {
	t.Parallel()
	redisURL := "redis://" + redisservers.Start(t).Addr()
	testscript.Run(t, testscript.Params{
		Dir:           "testdata/script",
		UpdateScripts: *updateScripts,
		Setup: func(env *testscript.Env) error {
			env.Setenv("PATH", filepath.Dir(spateBin)+string(os.PathListSeparator)+env.Getenv("PATH"))
			env.Setenv("REDIS", redisURL)
			return nil
		},
		Cmds: map[string]func(ts *testscript.TestScript, neg bool, args []string){
			// exits CODE PROG ARGS... runs PROG and requires exit code CODE;
			// its output is kept for stdout, stderr and cmp.
			"exits": func(ts *testscript.TestScript, neg bool, args []string) {
				if neg || len(args) < 2 {
					ts.Fatalf("usage: exits CODE PROG [ARGS...]")
				}
				want, err := strconv.Atoi(args[0])
				ts.Check(err)
				err = ts.Exec(args[1], args[2:]...)
				got := 0
				var exit *exec.ExitError
				switch {
				case errors.As(err, &exit):
					got = exit.ExitCode()
				case err != nil:
					ts.Fatalf("%s: %v", args[1], err)
				}
				if got != want {
					ts.Fatalf("%s exited %d, want %d", args[1], got, want)
				}
			},
		},
	})
}
