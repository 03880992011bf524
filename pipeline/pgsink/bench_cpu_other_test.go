//go:build !unix

package pgsink_test

// cpuTime is unknown here.
func cpuTime() int64 { return -1 }
