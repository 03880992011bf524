//go:build !unix

package pipeline_test

// cpuTime is unknown here.
func cpuTime() int64 { return -1 }
