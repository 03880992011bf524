package redistest_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/spate-go/spate/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestRestartKeepsAddressAndData: a clean restart and a crash restart both
// come back on the same port with the AOF's data.
func TestRestartKeepsAddressAndData(t *testing.T) {
	srv := redistest.Start(t, redistest.WithAOF())
	addr := srv.Addr()
	c := srv.Client(t)
	ctx := t.Context()
	if err := c.Set(ctx, "k", "v1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	srv.Restart()
	if srv.Addr() != addr {
		t.Fatalf("restart moved the server from %s to %s", addr, srv.Addr())
	}
	if err := c.Set(ctx, "k2", "v2", 0).Err(); err != nil { // go-redis redials
		t.Fatal(err)
	}
	srv.Kill()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("a killed server answered")
	}
	srv.StartAgain()
	for k, want := range map[string]string{"k": "v1", "k2": "v2"} {
		if got, err := c.Get(ctx, k).Result(); err != nil || got != want {
			t.Errorf("after restarts %q = %q (%v), want %q", k, got, err, want)
		}
	}
	if srv.Log() == "" {
		t.Error("the server's log tail is empty")
	}
}
