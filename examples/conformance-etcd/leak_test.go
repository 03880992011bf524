package conformance_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Optional: fail the run if anything the suite, the harness or the server
// started is still running after the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
