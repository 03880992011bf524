package jobview_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/jobview"
	"github.com/spate-go/spate/stores/etcd/etcdtest"
	"github.com/spate-go/spate/stores/nats/natstest"
	"github.com/spate-go/spate/stores/redis/redistest"
	"github.com/spate-go/spate/storeurl"

	_ "github.com/spate-go/spate/stores/etcd"
	_ "github.com/spate-go/spate/stores/nats"
	_ "github.com/spate-go/spate/stores/redis"
)

// urlOpener opens job-a on a store URL, a new handle per view.
type urlOpener struct{ url string }

func (o urlOpener) Jobs(context.Context) ([]string, error) { return []string{"job-a"}, nil }
func (o urlOpener) Open(ctx context.Context, job string) (spate.Store, error) {
	return storeurl.OpenStore(ctx, o.url, job, 2*time.Second, storeurl.Options{})
}

// The view works the same on every store: on real etcd, Redis and NATS
// servers, its page lists a running job's splits and a commit reaches an
// open page's event stream as a change of that split's row.
func TestTheViewFollowsAJobOnEveryStore(t *testing.T) {
	for _, tc := range []struct {
		name string
		url  func(t *testing.T) string
	}{
		{"etcd", func(t *testing.T) string {
			return "etcd://" + strings.TrimPrefix(etcdtest.Start(t).Endpoints()[0], "http://")
		}},
		{"redis", func(t *testing.T) string { return "redis://" + redistest.Start(t).Addr() }},
		{"nats", func(t *testing.T) string { return natstest.Start(t).URL() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := tc.url(t)
			st, err := storeurl.OpenStore(t.Context(), url, "job-a", 2*time.Second, storeurl.Options{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = st.Close() })
			cfg := spate.TimingsForLease(2 * time.Second)
			cfg.InstanceID = "w1"
			cfg.RebalanceDelay = spate.NoRebalanceDelay
			c, err := spate.NewStoreCoordinator(st, cfg, spate.WithLogger(slog.New(slog.DiscardHandler)))
			require.NoError(t, err)
			c.SetWaker(spate.NewWaker())
			require.NoError(t, c.Start(planner{n: 4}))
			t.Cleanup(func() { _ = c.Abandon() })
			w := &worker{c: c, held: map[spate.SplitID]spate.LeaseEpoch{}}
			w.pollUntil(t, "w1 holds every split", func() bool { return len(w.held) == 4 })

			v := jobview.New(jobview.Config{Opener: urlOpener{url}, Store: tc.name, Log: slog.New(slog.DiscardHandler)})
			srv := httptest.NewServer(v)
			t.Cleanup(func() { srv.Close(); _ = v.Close() })
			var body string
			require.Eventually(t, func() bool {
				_, body = get(t, srv.URL+"/jobs/job-a")
				return strings.Count(body, `id="s-part-`) == 4 && strings.Contains(body, ">w1<")
			}, 10*time.Second, 50*time.Millisecond, "the page never listed the 4 leased splits:\n%.3000s", body)
			events, _ := stream(t, srv.URL+"/jobs/job-a/events?since="+pageRev(t, body))
			split := spate.MustSplitID("part-01")
			require.NoError(t, w.c.CommitAt(t.Context(), split, w.held[split], spate.NewSplitProgress(700, nil)))
			ev := waitEvent(t, events, `"watermark":700`)
			require.Contains(t, ev.data, `"id":"part-01"`)
			require.NotContains(t, ev.data, `"id":"part-02"`, "an unchanged split was sent")
		})
	}
}
