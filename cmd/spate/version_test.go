package main

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// spate --version (and -version, and spate version) prints one line: the
// build's version and the Go toolchain, and exits 0.
func TestVersion(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"--version", "-version", "version"} {
		code, out, errOut := runSpate(t, t.TempDir(), "", 30*time.Second, arg)
		assert.Equal(t, exitOK, code, errOut)
		assert.Empty(t, errOut)
		assert.Equal(t, 1, strings.Count(out, "\n"), out)
		assert.True(t, strings.HasPrefix(out, "spate "), out)
		assert.Contains(t, out, runtime.Version())
		assert.Contains(t, out, runtime.GOOS+"/"+runtime.GOARCH)
	}
}

// A version set at link time wins over the build info.
func TestVersionStringPrefersTheLinkedVersion(t *testing.T) {
	old := version
	t.Cleanup(func() { version = old })
	version = "v9.8.7"
	assert.True(t, strings.HasPrefix(versionString(), "spate v9.8.7 "), versionString())
}
