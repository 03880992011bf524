package nats

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	natsgo "github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPermHandlerRecognised: a handler made at any call site has the code
// pointer watchPermissions looks for, so a second store on a connection
// does not chain a second handler.
func TestPermHandlerRecognised(t *testing.T) {
	h := chainPermHandler(&permWatch{}, func(*natsgo.Conn, *natsgo.Subscription, error) {})
	require.Equal(t, permHandlerPC, reflect.ValueOf(h).Pointer(), "the driver's error handler is not recognised")
}

func TestSubjectMatches(t *testing.T) {
	for _, tc := range []struct {
		pattern, subject string
		want             bool
	}{
		{"$JS.API.INFO", "$JS.API.INFO", true},
		{"$JS.API.INFO", "$JS.API.INFO.X", false},
		{"$JS.API.CONSUMER.CREATE.KV_b.>", "$JS.API.CONSUMER.CREATE.KV_b.c1.$KV.b.>", true},
		{"$JS.API.CONSUMER.CREATE.KV_b.>", "$JS.API.CONSUMER.CREATE.KV_b", false},
		{"$JS.API.CONSUMER.MSG.NEXT.KV_b.*", "$JS.API.CONSUMER.MSG.NEXT.KV_b.c1", true},
		{"$JS.API.CONSUMER.MSG.NEXT.KV_b.*", "$JS.API.CONSUMER.MSG.NEXT.KV_c.c1", false},
		{"$KV.b.>", "$KV.b.some.key", true},
	} {
		assert.Equal(t, tc.want, subjectMatches(tc.pattern, tc.subject), "subjectMatches(%q, %q)", tc.pattern, tc.subject)
	}
}

func TestParseViolation(t *testing.T) {
	pub := fmt.Errorf("%w: %s", natsgo.ErrPermissionViolation, `Permissions Violation for Publish to "$JS.API.INFO"`)
	sub := fmt.Errorf("%w: %s", natsgo.ErrPermissionViolation, `Permissions Violation for Subscription to "_INBOX.x.*" using queue "q"`)
	v, ok := parseViolation(pub)
	assert.True(t, ok, "publish violation parsed as %+v, %t", v, ok)
	assert.False(t, v.subscribe, "publish violation parsed as %+v, %t", v, ok)
	assert.Equal(t, "$JS.API.INFO", v.subject, "publish violation parsed as %+v, %t", v, ok)
	v, ok = parseViolation(sub)
	assert.True(t, ok, "subscribe violation parsed as %+v, %t", v, ok)
	assert.True(t, v.subscribe, "subscribe violation parsed as %+v, %t", v, ok)
	assert.Equal(t, "_INBOX.x.*", v.subject, "subscribe violation parsed as %+v, %t", v, ok)
	_, ok = parseViolation(errors.New(`Permissions Violation for Publish to "x"`))
	assert.False(t, ok, "an error that is not ErrPermissionViolation parsed as a violation")
	p := permScope{job: "j", inboxPrefix: "_INBOX.", streams: []string{"KV_spate_coordination_j_state"}, buckets: []string{"$KV.spate_coordination_j_state."}}
	for subj, owned := range map[string]bool{
		"$JS.API.INFO": true, "_INBOX.abc.*": true, "$KV.spate_coordination_j_state.k": true,
		"$JS.API.STREAM.MSG.GET.KV_spate_coordination_j_state": true,
		"$JS.API.STREAM.MSG.GET.KV_other":                      false,
		"$KV.other.k":                                          false,
		"app.subject":                                          false,
	} {
		assert.Equal(t, owned, p.owns(violation{subject: subj}), "owns(%q)", subj)
	}
}
