package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	spatenats "github.com/spate-go/spate/stores/nats"
)

// natsSchemes is appended to the list of known schemes in errors.
const natsSchemes = ", nats, tls"

// natsConnector reaches a NATS deployment: nats://host:port[,nats://host:port...]
// (tls:// for TLS), with ?replicas=N for the buckets' replica count.
type natsConnector struct {
	servers  string
	replicas int
	opts     []natsgo.Option
}

func newNatsConnector(raw string, tlsCfg *tls.Config, user, password, token, creds string) (*natsConnector, error) {
	servers, query, _ := strings.Cut(raw, "?")
	n := &natsConnector{servers: servers, replicas: 1}
	raw = redactStoreURL(raw) // from here on raw is only shown
	if query != "" {
		q, err := url.ParseQuery(query)
		if err != nil {
			return nil, fmt.Errorf("--store %q: %w", raw, err)
		}
		for k := range q {
			if k != "replicas" {
				return nil, fmt.Errorf("--store %q: unknown parameter %q (NATS takes ?replicas=N)", raw, k)
			}
		}
		if r := q.Get("replicas"); r != "" {
			v, err := strconv.Atoi(r)
			if err != nil || (v != 1 && v != 3 && v != 5) {
				return nil, fmt.Errorf("--store %q: replicas must be 1, 3 or 5", raw)
			}
			n.replicas = v
		}
	}
	n.opts = []natsgo.Option{natsgo.Name("spate")}
	if tlsCfg != nil {
		n.opts = append(n.opts, natsgo.Secure(tlsCfg))
	}
	if user != "" || password != "" {
		n.opts = append(n.opts, natsgo.UserInfo(user, password))
	}
	if token != "" {
		n.opts = append(n.opts, natsgo.Token(token))
	}
	if creds != "" {
		n.opts = append(n.opts, natsgo.UserCredentials(creds))
	}
	return n, nil
}

func (n *natsConnector) describe() string {
	return fmt.Sprintf("nats at %s (buckets R%d)", redactStoreURL(n.servers), n.replicas)
}

func (n *natsConnector) close() {}

// connect dials a new connection (each store gets its own, as separate
// processes would), bounded by ctx.
func (n *natsConnector) connect(ctx context.Context) (*natsgo.Conn, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
	}
	// Clipped: Connect appends to the options it is given, and connects run
	// concurrently over one shared slice.
	return spatenats.Connect(ctx, n.servers, slices.Clip(n.opts)...)
}

func (n *natsConnector) open(ctx context.Context, ns string, ttl time.Duration, log *slog.Logger) (*openedStore, error) {
	nc, err := n.connect(ctx)
	if err != nil {
		return nil, err
	}
	st, err := spatenats.New(ctx, nc, spatenats.Options{Job: ns, TTL: ttl, Replicas: n.replicas, Logger: log})
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &openedStore{Store: st, closeClient: nc.Close}, nil
}

// withJS runs f over a JetStream context on a fresh connection.
func (n *natsConnector) withJS(ctx context.Context, f func(jetstream.JetStream) error) error {
	nc, err := n.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	return f(js)
}

// deleteNamespace deletes the job's two buckets.
func (n *natsConnector) deleteNamespace(ctx context.Context, ns string) error {
	return n.withJS(ctx, func(js jetstream.JetStream) error {
		var errs []error
		d, e := spatenats.Buckets(ns)
		for _, b := range []string{d, e} {
			if err := js.DeleteKeyValue(ctx, b); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
				errs = append(errs, fmt.Errorf("delete bucket %s: %w", b, err))
			}
		}
		return errors.Join(errs...)
	})
}

// jobs lists the jobs whose durable bucket exists.
func (n *natsConnector) jobs(ctx context.Context) ([]string, error) {
	var out []string
	err := n.withJS(ctx, func(js jetstream.JetStream) error {
		names := js.KeyValueStoreNames(ctx)
		for name := range names.Name() {
			if job, ok := strings.CutPrefix(name, "spate_coordination_"); ok {
				if job, ok := strings.CutSuffix(job, "_state"); ok {
					out = append(out, job)
				}
			}
		}
		return names.Error()
	})
	slices.Sort(out)
	return out, err
}

// jobExists reports whether the job's durable bucket exists.
func (n *natsConnector) jobExists(ctx context.Context, job string) (bool, error) {
	found := false
	err := n.withJS(ctx, func(js jetstream.JetStream) error {
		d, _ := spatenats.Buckets(job)
		_, err := js.KeyValue(ctx, d)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil
		}
		found = err == nil
		return err
	})
	return found, err
}

// recordedTTL is the lease bucket's max age: the job's lease, which the
// driver refuses to change mid-job.
func (n *natsConnector) recordedTTL(ctx context.Context, job string) (time.Duration, bool) {
	var ttl time.Duration
	err := n.withJS(ctx, func(js jetstream.JetStream) error {
		_, e := spatenats.Buckets(job)
		kv, err := js.KeyValue(ctx, e)
		if err != nil {
			return err
		}
		st, err := kv.Status(ctx)
		if err != nil {
			return err
		}
		ttl = st.TTL()
		return nil
	})
	return ttl, err == nil && ttl > 0
}
