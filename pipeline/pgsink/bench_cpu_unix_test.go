//go:build unix

package pgsink_test

import "syscall"

// cpuTime is the process's user and system CPU time in nanoseconds, or -1
// (the PostgreSQL server is another process: this is the client's).
func cpuTime() int64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return -1
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}
