package etcd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/storeurl"
)

// DefaultRoot is where a deployment opened by URL keeps its jobs: job J's
// keys are under DefaultRoot + "J/" ([JobPrefix]). The URL parameter
// prefix moves it.
const DefaultRoot = "/spate/"

// JobPrefix is the Options.Prefix of job under root (a prefix ending with
// '/'): root + job + "/".
func JobPrefix(root, job string) string { return root + job + "/" }

// The etcd:// and etcds:// schemes:
//
//	etcd://[user:password@]host:port[,host:port...][?prefix=/spate/]
//
// etcds://, Options.TLS or a TLS file parameter makes the endpoints https.
// Every store opened over the deployment has its own client, which the
// store closes.
func init() {
	storeurl.Register("etcd", storeurl.OpenerFunc(openURL))
	storeurl.Register("etcds", storeurl.OpenerFunc(openURL))
}

func openURL(_ context.Context, c *storeurl.Config) (storeurl.Deployment, error) {
	if err := c.CheckParams("prefix"); err != nil {
		return nil, err
	}
	if c.Path != "" && c.Path != "/" {
		return nil, c.Errorf("etcd URLs take no path (the jobs' root is ?prefix=%s)", DefaultRoot)
	}
	root := DefaultRoot
	if p := c.Params.Get("prefix"); p != "" {
		root = p
	}
	if err := validatePrefix(root); err != nil {
		return nil, c.Errorf("prefix: %v", strings.TrimPrefix(err.Error(), "Prefix "))
	}
	if len(root)+66 > PrefixMaxLen {
		return nil, c.Errorf("prefix is longer than %d bytes", PrefixMaxLen-66)
	}
	if len(c.Hosts) == 0 {
		return nil, c.Errorf("names no etcd endpoint (etcd://host:port[,host:port...])")
	}
	tlsCfg := c.TLS
	if c.Scheme == "etcds" && tlsCfg == nil {
		tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	scheme := "http://"
	if tlsCfg != nil {
		scheme = "https://"
	}
	eps := make([]string, len(c.Hosts))
	for i, h := range c.Hosts {
		eps[i] = scheme + h
	}
	desc := "etcd at " + strings.Join(eps, ",")
	if root != DefaultRoot {
		desc += " (jobs under " + root + ")"
	}
	return &deployment{
		cfg: clientv3.Config{Endpoints: eps, DialTimeout: c.DialTimeout, TLS: tlsCfg,
			Username: c.Username, Password: c.Password, Logger: zap.NewNop(), DialOptions: DialOptions()},
		root: root,
		log:  c.Logger,
		info: storeurl.Info{Driver: "etcd", Description: desc, TLS: tlsCfg != nil,
			TTLResolution: time.Second, MinTTL: 2 * time.Second},
	}, nil
}

// deployment is an etcd cluster reached by URL.
type deployment struct {
	cfg  clientv3.Config
	root string
	log  *slog.Logger
	info storeurl.Info
}

func (d *deployment) Info() storeurl.Info { return d.info }

// client makes a client. Credentials the server refuses are Fatal; an
// endpoint that does not answer within the dial timeout is Retryable.
func (d *deployment) client() (*clientv3.Client, error) {
	cli, err := clientv3.New(d.cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd: client: %w: %w", err, classOfClientError(err))
	}
	return cli, nil
}

func classOfClientError(err error) error {
	for _, fatal := range []error{rpctypes.ErrAuthFailed, rpctypes.ErrUserEmpty, rpctypes.ErrUserNotFound,
		rpctypes.ErrAuthNotEnabled, rpctypes.ErrInvalidAuthToken} {
		if errors.Is(rpctypes.Error(err), fatal) {
			return spate.ErrFatal
		}
	}
	return spate.ErrRetryable
}

func (d *deployment) Open(ctx context.Context, job string, ttl time.Duration) (spate.Store, error) {
	cli, err := d.client()
	if err != nil {
		return nil, err
	}
	st, err := New(ctx, cli, Options{Prefix: JobPrefix(d.root, job), TTL: ttl, Logger: d.log})
	if err != nil {
		_ = cli.Close()
		return nil, err
	}
	st.s.ownsClient = true
	return st, nil
}

// with runs f over a client of its own.
func (d *deployment) with(f func(*clientv3.Client) error) error {
	cli, err := d.client()
	if err != nil {
		return err
	}
	defer cli.Close()
	return f(cli)
}

// Jobs lists the jobs holding a key under the root: it steps from one
// job's prefix to the next, one key per request.
func (d *deployment) Jobs(ctx context.Context) ([]string, error) {
	var out []string
	err := d.with(func(cli *clientv3.Client) error {
		from, end := d.root, clientv3.GetPrefixRangeEnd(d.root)
		for {
			resp, err := cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
			if err != nil {
				return classifyCall(ctx, "list the jobs under "+d.root, err)
			}
			if len(resp.Kvs) == 0 {
				return nil
			}
			key := string(resp.Kvs[0].Key)
			job, _, nested := strings.Cut(strings.TrimPrefix(key, d.root), "/")
			if !nested || storeurl.ValidateJob(job) != nil {
				from = key + "\x00" // not a job's key: step over it
				continue
			}
			out = append(out, job)
			from = clientv3.GetPrefixRangeEnd(JobPrefix(d.root, job))
		}
	})
	return out, err
}

func (d *deployment) JobExists(ctx context.Context, job string) (bool, error) {
	found := false
	err := d.with(func(cli *clientv3.Client) error {
		p := JobPrefix(d.root, job)
		resp, err := cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
		if err != nil {
			return classifyCall(ctx, "look up "+p, err)
		}
		found = len(resp.Kvs) > 0
		return nil
	})
	return found, err
}

// DeleteJob deletes every key under the job's prefix in one request; the
// leases of its ephemeral keys expire on their own.
func (d *deployment) DeleteJob(ctx context.Context, job string) error {
	return d.with(func(cli *clientv3.Client) error {
		p := JobPrefix(d.root, job)
		if _, err := cli.Delete(ctx, p, clientv3.WithPrefix()); err != nil {
			return classifyCall(ctx, "delete "+p, err)
		}
		return nil
	})
}

// RecordedTTL: etcd records no TTL with a job.
func (d *deployment) RecordedTTL(context.Context, string) (time.Duration, bool, error) {
	return 0, false, nil
}

func (d *deployment) Close() error { return nil }
