package main

import (
	"fmt"
	"os"
	"runtime/pprof"
	"runtime/trace"
)

// Profiling hooks for measuring the real command (not flags: they are for
// whoever works on spate, not for its users):
//
//	SPATE_CPUPROFILE=FILE  write a CPU profile of the whole run (go tool pprof)
//	SPATE_TRACE=FILE       write an execution trace (go tool trace): where
//	                       goroutines block, syscalls, GC
//
// A run that exits through os.Exit elsewhere (a second signal) writes
// nothing.
func withProfiles(run func() int) int {
	if path := os.Getenv("SPATE_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "spate: SPATE_CPUPROFILE: %v\n", err)
			return exitFailed
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(os.Stderr, "spate: SPATE_CPUPROFILE: %v\n", err)
			_ = f.Close()
			return exitFailed
		}
		defer func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		}()
	}
	if path := os.Getenv("SPATE_TRACE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "spate: SPATE_TRACE: %v\n", err)
			return exitFailed
		}
		if err := trace.Start(f); err != nil {
			fmt.Fprintf(os.Stderr, "spate: SPATE_TRACE: %v\n", err)
			_ = f.Close()
			return exitFailed
		}
		defer func() {
			trace.Stop()
			_ = f.Close()
		}()
	}
	return run()
}
