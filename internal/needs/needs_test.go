package needs

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
)

// ended records how Missing ended a test instead of ending it.
type ended struct {
	testing.TB
	fatal, skip string
}

func (e *ended) Helper()                           {}
func (e *ended) Fatalf(format string, args ...any) { e.fatal = fmt.Sprintf(format, args...) }
func (e *ended) Skipf(format string, args ...any)  { e.skip = fmt.Sprintf(format, args...) }

func TestMissingFailsUnderCIAndSkipsElsewhere(t *testing.T) {
	t.Setenv("CI", "true")
	e := &ended{TB: t}
	Missing(e, "logrotate is missing (apt-get install logrotate)")
	assert.Equal(t, "CI=true and logrotate is missing (apt-get install logrotate)", e.fatal)

	t.Setenv("CI", "")
	e = &ended{TB: t}
	Missing(e, "logrotate is missing (apt-get install logrotate)")
	assert.Empty(t, e.fatal)
	assert.Equal(t, "SKIPPING REAL-SERVER TEST: logrotate is missing (apt-get install logrotate)", e.skip)
}
