package main

import (
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

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
			// waitworkers STORE JOB N waits up to 30s until the job has N
			// live workers (spate jobs --long), for a script that starts a
			// worker in the background or stops one.
			"waitworkers": func(ts *testscript.TestScript, neg bool, args []string) {
				if neg || len(args) != 3 {
					ts.Fatalf("usage: waitworkers STORE JOB N")
				}
				want, err := strconv.Atoi(args[2])
				ts.Check(err)
				row := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(args[1]) + `\s+\S+\s+\S+\s+(\d+)$`)
				got := -1
				for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
					if ts.Exec("spate", "jobs", "--store", args[0], "--long") != nil {
						continue // the job may not exist yet
					}
					got = -1
					if m := row.FindStringSubmatch(ts.ReadFile("stdout")); m != nil {
						got, _ = strconv.Atoi(m[1])
					}
					if got == want || got == -1 && want == 0 {
						return
					}
				}
				ts.Fatalf("job %s on %s: %d live workers after 30s, want %d", args[1], args[0], got, want)
			},
		},
	})
}
