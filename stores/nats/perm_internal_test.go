package nats

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	natsgo "github.com/nats-io/nats.go"
)

// TestPermHandlerRecognised: a handler made at any call site has the code
// pointer watchPermissions looks for, so a second store on a connection
// does not chain a second handler.
func TestPermHandlerRecognised(t *testing.T) {
	h := chainPermHandler(&permWatch{}, func(*natsgo.Conn, *natsgo.Subscription, error) {})
	if reflect.ValueOf(h).Pointer() != permHandlerPC {
		t.Fatal("the driver's error handler is not recognised")
	}
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
		if got := subjectMatches(tc.pattern, tc.subject); got != tc.want {
			t.Errorf("subjectMatches(%q, %q) = %t, want %t", tc.pattern, tc.subject, got, tc.want)
		}
	}
}

func TestParseViolation(t *testing.T) {
	pub := fmt.Errorf("%w: %s", natsgo.ErrPermissionViolation, `Permissions Violation for Publish to "$JS.API.INFO"`)
	sub := fmt.Errorf("%w: %s", natsgo.ErrPermissionViolation, `Permissions Violation for Subscription to "_INBOX.x.*" using queue "q"`)
	if v, ok := parseViolation(pub); !ok || v.subscribe || v.subject != "$JS.API.INFO" {
		t.Errorf("publish violation parsed as %+v, %t", v, ok)
	}
	if v, ok := parseViolation(sub); !ok || !v.subscribe || v.subject != "_INBOX.x.*" {
		t.Errorf("subscribe violation parsed as %+v, %t", v, ok)
	}
	if _, ok := parseViolation(errors.New(`Permissions Violation for Publish to "x"`)); ok {
		t.Error("an error that is not ErrPermissionViolation parsed as a violation")
	}
	p := permScope{job: "j", inboxPrefix: "_INBOX.", streams: []string{"KV_spate_coordination_j_state"}, buckets: []string{"$KV.spate_coordination_j_state."}}
	for subj, owned := range map[string]bool{
		"$JS.API.INFO": true, "_INBOX.abc.*": true, "$KV.spate_coordination_j_state.k": true,
		"$JS.API.STREAM.MSG.GET.KV_spate_coordination_j_state": true,
		"$JS.API.STREAM.MSG.GET.KV_other":                      false,
		"$KV.other.k":                                          false,
		"app.subject":                                          false,
	} {
		if got := p.owns(violation{subject: subj}); got != owned {
			t.Errorf("owns(%q) = %t, want %t", subj, got, owned)
		}
	}
}
