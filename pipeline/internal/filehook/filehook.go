// Package filehook holds the staged file sink's fault-injection hook. It
// lives apart from pipeline/filesink so that both the sink (which calls
// it) and the tests of package pipeline (which drive a coordination
// driver over the sink and set it) can reach it without exporting it
// from either package.
package filehook

import "os"

// PublishWrite runs a staged file sink's publish write of n bytes at off
// to out. Tests replace it to inject a write that fails halfway, as a
// full disk does.
var PublishWrite = func(out *os.File, off, n int64, write func() error) error { return write() }

// SetPublishWriteForTest replaces PublishWrite until restore.
func SetPublishWriteForTest(f func(out *os.File, off, n int64, write func() error) error) (restore func()) {
	real := PublishWrite
	PublishWrite = f
	return func() { PublishWrite = real }
}
