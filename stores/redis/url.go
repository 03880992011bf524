package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/storeurl"
)

// The redis:// and rediss:// (TLS) schemes:
//
//	redis://[user:password@]host:port[/db][?go-redis parameters]
//
// one primary, through a go-redis Client; the query takes go-redis's own
// URL parameters (protocol, client_name, pool_size, dial_timeout, ...). A
// Cluster or Sentinel deployment needs [New] with a UniversalClient. Every
// store opened over the deployment has its own client, which the store
// closes; the namespace operations share one.
func init() {
	storeurl.Register("redis", storeurl.OpenerFunc(openURL))
	storeurl.Register("rediss", storeurl.OpenerFunc(openURL))
}

// goredisParams are the URL parameters go-redis's ParseURL takes (v9):
// checked here so that an unknown one is refused naming them, as every
// scheme's are.
var goredisParams = []string{"client_name", "conn_max_idle_time", "conn_max_lifetime", "conn_max_lifetime_jitter", "db",
	"dial_timeout", "idle_timeout", "max_active_conns", "max_concurrent_dials", "max_conn_age", "max_idle_conns",
	"max_retries", "max_retry_backoff", "min_idle_conns", "min_retry_backoff", "pipeline_pool_size",
	"pipeline_read_buffer_size", "pipeline_write_buffer_size", "pool_fifo", "pool_size", "pool_timeout", "protocol",
	"read_timeout", "skip_verify", "write_timeout"}

func openURL(_ context.Context, c *storeurl.Config) (storeurl.Deployment, error) {
	if len(c.Hosts) != 1 {
		return nil, c.Errorf("a Redis URL names one server (redis://host:port[/db]); for Cluster or Sentinel use the Go API")
	}
	if c.TLS != nil && c.Scheme != "rediss" {
		return nil, c.Errorf("TLS settings need a rediss:// URL")
	}
	// go-redis parses the rest: the address, the database and its own
	// parameters. The credentials stay out of what it sees, so its errors
	// cannot quote them.
	if err := c.CheckParams(goredisParams...); err != nil {
		return nil, err
	}
	bare := c.Scheme + "://" + c.Hosts[0] + c.Path
	if len(c.Params) > 0 {
		bare += "?" + c.Params.Encode()
	}
	o, err := goredis.ParseURL(bare)
	if err != nil {
		return nil, c.Errorf("%s", strings.TrimPrefix(err.Error(), "redis: "))
	}
	o.Username, o.Password = c.Username, c.Password
	if c.TLS != nil {
		cfg := c.TLS.Clone()
		if cfg.ServerName == "" {
			cfg.ServerName = o.TLSConfig.ServerName
		}
		o.TLSConfig = cfg
	}
	o.ContextTimeoutEnabled = true
	o.DialTimeout = c.DialTimeout
	desc := c.Scheme + "://" + o.Addr
	if o.DB != 0 {
		desc += "/" + strconv.Itoa(o.DB)
	}
	return &deployment{opts: o, ns: goredis.NewClient(o), log: c.Logger,
		info: storeurl.Info{Driver: driverName, Description: desc, TLS: o.TLSConfig != nil, MinTTL: TTLFloor}}, nil
}

// deployment is a Redis primary reached by URL.
type deployment struct {
	opts *goredis.Options
	ns   *goredis.Client // for the namespace operations
	log  *slog.Logger
	info storeurl.Info
}

func (d *deployment) Info() storeurl.Info { return d.info }

func (d *deployment) Open(ctx context.Context, job string, ttl time.Duration) (spate.Store, error) {
	cli := goredis.NewClient(d.opts)
	st, err := New(ctx, cli, Options{Job: job, TTL: ttl, Logger: d.log})
	if err != nil {
		_ = cli.Close()
		return nil, err
	}
	st.s.ownsClient = true
	return st, nil
}

// metaKey is the job's meta hash, which the startup check writes: it
// marks the job as existing, and records its TTL.
func metaKey(job string) string { return "spate:{" + job + "}:meta" }

func nsErr(what string, err error) error {
	return fmt.Errorf("redis: %s: %w: %w", what, err, classOf(err))
}

// Jobs lists the jobs that have a meta hash.
func (d *deployment) Jobs(ctx context.Context) ([]string, error) {
	var out []string
	iter := d.ns.Scan(ctx, 0, "spate:{*}:meta", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		job, ok := strings.CutPrefix(k, "spate:{")
		if job, ok2 := strings.CutSuffix(job, "}:meta"); ok && ok2 && storeurl.ValidateJob(job) == nil {
			out = append(out, job)
		}
	}
	if err := iter.Err(); err != nil {
		return nil, nsErr("list the jobs", err)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

func (d *deployment) JobExists(ctx context.Context, job string) (bool, error) {
	n, err := d.ns.Exists(ctx, metaKey(job)).Result()
	if err != nil {
		return false, nsErr("look up job "+job, err)
	}
	return n > 0, nil
}

// DeleteJob deletes every key "spate:{job}:*", the meta hash included.
func (d *deployment) DeleteJob(ctx context.Context, job string) error {
	pattern := "spate:{" + job + "}:*"
	iter := d.ns.Scan(ctx, 0, pattern, 1000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		return nsErr("scan "+pattern, err)
	}
	for chunk := range slices.Chunk(keys, 500) {
		if err := d.ns.Del(ctx, chunk...).Err(); err != nil {
			return nsErr("delete "+pattern, err)
		}
	}
	return nil
}

// RecordedTTL reads the TTL the meta hash records.
func (d *deployment) RecordedTTL(ctx context.Context, job string) (time.Duration, bool, error) {
	v, err := d.ns.HGet(ctx, metaKey(job), "ttl_ms").Int64()
	if errors.Is(err, goredis.Nil) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, nsErr("read the TTL of job "+job, err)
	}
	if v <= 0 {
		return 0, false, nil
	}
	return time.Duration(v) * time.Millisecond, true, nil
}

func (d *deployment) Close() error { return d.ns.Close() }
