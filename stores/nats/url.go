package nats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/storeurl"
)

// The nats:// and tls:// (TLS) schemes:
//
//	nats://[user:password@|token@]host:port[,host:port...][?replicas=1|3|5][&creds=FILE]
//
// replicas sets the buckets' replicas (default 1, for development); creds
// names a NATS credentials file (JWT and nkey seed). A user name without a
// password is a token, as nats.go reads it. Every store opened over the
// deployment has its own connection, which the store closes.
func init() {
	storeurl.Register("nats", storeurl.OpenerFunc(openURL))
	storeurl.Register("tls", storeurl.OpenerFunc(openURL))
}

func openURL(_ context.Context, c *storeurl.Config) (storeurl.Deployment, error) {
	if err := c.CheckParams("replicas", "creds"); err != nil {
		return nil, err
	}
	if c.Path != "" && c.Path != "/" {
		return nil, c.Errorf("NATS URLs take no path")
	}
	if len(c.Hosts) == 0 {
		return nil, c.Errorf("names no NATS server (nats://host:port[,host:port...])")
	}
	replicas := 1
	if r := c.Params.Get("replicas"); r != "" {
		v, err := strconv.Atoi(r)
		if err != nil || (v != 1 && v != 3 && v != 5) {
			return nil, c.Errorf("replicas must be 1, 3 or 5")
		}
		replicas = v
	}
	servers := make([]string, len(c.Hosts))
	for i, h := range c.Hosts {
		servers[i] = c.Scheme + "://" + h
	}
	user, password, token := c.Username, c.Password, c.Token
	if c.User != nil && user == c.User.Username() {
		if _, hasPassword := c.User.Password(); !hasPassword && password == "" {
			// nats://token@host: nats.go reads a lone user name as a token.
			if token == "" {
				token = user
			}
			user = ""
		}
	}
	opts := []natsgo.Option{natsgo.Name("spate")}
	if c.TLS != nil {
		opts = append(opts, natsgo.Secure(c.TLS))
	}
	if user != "" || password != "" {
		opts = append(opts, natsgo.UserInfo(user, password))
	}
	if token != "" {
		opts = append(opts, natsgo.Token(token))
	}
	if f := c.Params.Get("creds"); f != "" {
		opts = append(opts, natsgo.UserCredentials(f))
	}
	desc := fmt.Sprintf("nats at %s (buckets R%d)", strings.Join(servers, ","), replicas)
	return &deployment{servers: strings.Join(servers, ","), replicas: replicas, opts: opts, log: c.Logger,
		dialTimeout: c.DialTimeout,
		info: storeurl.Info{Driver: driverName, Description: desc, TLS: c.TLS != nil || c.Scheme == "tls",
			MinTTL: TTLFloor}}, nil
}

// deployment is NATS servers reached by URL.
type deployment struct {
	servers     string
	replicas    int
	opts        []natsgo.Option
	log         *slog.Logger
	dialTimeout time.Duration
	info        storeurl.Info
}

func (d *deployment) Info() storeurl.Info { return d.info }

// connect dials a new connection, bounded by ctx's deadline, or by twice
// the dial timeout without one (nats.go tries every server of the list).
func (d *deployment) connect(ctx context.Context) (*natsgo.Conn, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*d.dialTimeout)
		defer cancel()
	}
	// Clipped: Connect appends to the options it is given, and connects
	// run concurrently over one shared slice.
	return Connect(ctx, d.servers, slices.Clip(d.opts)...)
}

func (d *deployment) Open(ctx context.Context, job string, ttl time.Duration) (spate.Store, error) {
	nc, err := d.connect(ctx)
	if err != nil {
		return nil, err
	}
	st, err := New(ctx, nc, Options{Job: job, TTL: ttl, Replicas: d.replicas, Logger: d.log})
	if err != nil {
		nc.Close()
		return nil, err
	}
	st.s.ownedConn = nc
	return st, nil
}

// withJS runs f over a JetStream context on a connection of its own.
//
// The connection is its own, so any permission the server refuses on it is
// one f needed: nats.go reports that only to the connection's error
// handler, and the request would simply time out (a user without the
// permission saw a --connect-timeout, not the permission). f's ctx is
// cancelled at the refusal, and the error names the subject.
func (d *deployment) withJS(ctx context.Context, f func(context.Context, jetstream.JetStream) error) (err error) {
	nc, err := d.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("nats: jetstream: %w: %w", err, spate.ErrFatal)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	remove := watchPermissions(nc).add(func(v violation) { cancel(&errPermDenied{v}) })
	defer remove()
	err = f(ctx, js)
	var pd *errPermDenied
	if err != nil && errors.As(context.Cause(ctx), &pd) {
		return fmt.Errorf("nats: %w", permissionError(pd.v, pd.v.subject))
	}
	return err
}

// Jobs lists the jobs whose durable bucket exists.
func (d *deployment) Jobs(ctx context.Context) ([]string, error) {
	var out []string
	err := d.withJS(ctx, func(ctx context.Context, js jetstream.JetStream) error {
		names := js.KeyValueStoreNames(ctx)
		for name := range names.Name() {
			if job, ok := strings.CutPrefix(name, "spate_coordination_"); ok {
				if job, ok := strings.CutSuffix(job, "_state"); ok && storeurl.ValidateJob(job) == nil {
					out = append(out, job)
				}
			}
		}
		if err := names.Error(); err != nil {
			return classifyOp("list", "buckets", err)
		}
		return nil
	})
	slices.Sort(out)
	return out, err
}

// JobExists reports whether the job's durable bucket exists.
func (d *deployment) JobExists(ctx context.Context, job string) (bool, error) {
	found := false
	err := d.withJS(ctx, func(ctx context.Context, js jetstream.JetStream) error {
		durable, _ := Buckets(job)
		_, err := js.KeyValue(ctx, durable)
		switch {
		case errors.Is(err, jetstream.ErrBucketNotFound):
			return nil
		case err != nil:
			return classifyOp("look up bucket", durable, err)
		}
		found = true
		return nil
	})
	return found, err
}

// DeleteJob deletes the job's two buckets.
func (d *deployment) DeleteJob(ctx context.Context, job string) error {
	return d.withJS(ctx, func(ctx context.Context, js jetstream.JetStream) error {
		var errs []error
		durable, ephemeral := Buckets(job)
		for _, b := range []string{durable, ephemeral} {
			if err := js.DeleteKeyValue(ctx, b); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
				errs = append(errs, classifyOp("delete bucket", b, err))
			}
		}
		return errors.Join(errs...)
	})
}

// RecordedTTL is the lease bucket's max age: the job's lease, which New
// refuses to change mid-job.
func (d *deployment) RecordedTTL(ctx context.Context, job string) (time.Duration, bool, error) {
	var ttl time.Duration
	err := d.withJS(ctx, func(ctx context.Context, js jetstream.JetStream) error {
		_, ephemeral := Buckets(job)
		kv, err := js.KeyValue(ctx, ephemeral)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil
		}
		if err != nil {
			return classifyOp("look up bucket", ephemeral, err)
		}
		st, err := kv.Status(ctx)
		if err != nil {
			return classifyOp("read the status of bucket", ephemeral, err)
		}
		ttl = st.TTL()
		return nil
	})
	return ttl, err == nil && ttl > 0, err
}

func (d *deployment) Close() error { return nil }
