package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/stores/mem"
)

// The job view at /ui of --metrics-addr: served on loopback, refused with
// a reason beyond loopback without SPATE_UI_TOKEN (the metrics stay
// served), asked for the token when one is set, read-only, and closing it
// leaves the command's own store open.
func TestMetricsAddrServesTheJobViewSafely(t *testing.T) {
	st, err := mem.New(mem.Options{TTL: 5 * time.Second})
	require.NoError(t, err)
	defer st.Close()
	ctx := context.Background()
	_, err = st.Create(ctx, spate.Durable, "x", []byte("1"))
	require.NoError(t, err)
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "metrics at "+r.URL.Path) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	get := func(h http.Handler, method, path, token string) (int, string) {
		req := httptest.NewRequest(method, path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}

	t.Setenv("SPATE_UI_TOKEN", "")
	local := mountJobView(metrics, "127.0.0.1:9100", "job1", st, "mem://", log, nil)
	code, body := get(local, "GET", "/ui/", "")
	require.Equal(t, http.StatusOK, code, body)
	assert.Contains(t, body, `href="/ui/jobs/job1"`)
	code, body = get(local, "GET", "/ui/jobs/job1", "")
	require.Equal(t, http.StatusOK, code, body)
	code, _ = get(local, "GET", "/ui/jobs/other", "")
	assert.NotEqual(t, http.StatusOK, code, "a worker's view showed a job it does not run")
	code, _ = get(local, "POST", "/ui/jobs/job1", "")
	assert.Equal(t, http.StatusMethodNotAllowed, code)
	code, body = get(local, "GET", "/metrics", "")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "metrics at /metrics", body)
	local.close()
	_, ok, err := st.Get(ctx, spate.Durable, "x")
	require.NoError(t, err, "closing the view closed the command's store")
	assert.True(t, ok)

	wide := mountJobView(metrics, "0.0.0.0:9100", "job1", st, "mem://", log, nil)
	code, body = get(wide, "GET", "/ui/jobs/job1", "")
	assert.Equal(t, http.StatusForbidden, code)
	assert.Contains(t, body, "SPATE_UI_TOKEN")
	code, _ = get(wide, "GET", "/metrics", "")
	assert.Equal(t, http.StatusOK, code, "refusing the view refused the metrics")
	wide.close()

	t.Setenv("SPATE_UI_TOKEN", "s3cret")
	guarded := mountJobView(metrics, "0.0.0.0:9100", "job1", st, "mem://", log, nil)
	defer guarded.close()
	code, _ = get(guarded, "GET", "/ui/jobs/job1", "")
	assert.Equal(t, http.StatusUnauthorized, code)
	code, body = get(guarded, "GET", "/ui/jobs/job1", "s3cret")
	assert.Equal(t, http.StatusOK, code, body)
	assert.NotContains(t, body, "s3cret", "the token is in the page")
}
