package mem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/driver"
	"github.com/spate-go/spate/storeurl"
)

// The mem:// scheme opens an in-process deployment: every job on it is a
// store of its own (New), shared by every store the deployment opens over
// the job, until the job is deleted or the deployment closed. Nothing else
// can reach it: every [storeurl.Open] of mem:// is a new, empty deployment.
func init() {
	storeurl.Register("mem", storeurl.OpenerFunc(openURL))
}

func openURL(_ context.Context, cfg *storeurl.Config) (storeurl.Deployment, error) {
	if len(cfg.Hosts) > 0 || (cfg.Path != "" && cfg.Path != "/") || cfg.User != nil {
		return nil, cfg.Errorf("mem:// takes no host, path or user: write mem://")
	}
	if err := cfg.CheckParams(); err != nil {
		return nil, err
	}
	return &deployment{jobs: map[string]*Store{}}, nil
}

// deployment is a set of in-process stores by job.
type deployment struct {
	mu     sync.Mutex
	jobs   map[string]*Store // the first handle of each job's store
	closed bool
}

func (d *deployment) Info() storeurl.Info {
	return storeurl.Info{Driver: "mem", Description: "in-process memory store (mem://): this process only", InProcess: true}
}

func (d *deployment) Open(_ context.Context, job string, ttl time.Duration) (spate.Store, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, driver.ClosedError("mem")
	}
	s := d.jobs[job]
	if s == nil {
		var err error
		if s, err = New(Options{TTL: ttl}); err != nil {
			return nil, err
		}
		d.jobs[job] = s
	} else if rec := s.h.b.opts.TTL; rec != ttl {
		return nil, spate.Fatalf("mem: job %q was opened with a TTL of %v, this store asks for %v: the TTL cannot change mid-job", job, rec, ttl)
	}
	return s.Connect()
}

func (d *deployment) Jobs(context.Context) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for job := range d.jobs {
		out = append(out, job)
	}
	slices.Sort(out)
	return out, nil
}

func (d *deployment) JobExists(_ context.Context, job string) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.jobs[job] != nil, nil
}

func (d *deployment) RecordedTTL(_ context.Context, job string) (time.Duration, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if s := d.jobs[job]; s != nil {
		return s.h.b.opts.TTL, true, nil
	}
	return 0, false, nil
}

// DeleteJob deletes every key of the job, as a server would: stores still
// open over it see the deletes (their watchers too), and the next Open
// starts the job afresh.
func (d *deployment) DeleteJob(ctx context.Context, job string) error {
	d.mu.Lock()
	s := d.jobs[job]
	delete(d.jobs, job)
	d.mu.Unlock()
	if s == nil {
		return nil
	}
	defer s.Close()
	var errs []error
	for _, ks := range []spate.Keyspace{spate.Durable, spate.Ephemeral} {
		es, err := s.List(ctx, ks, "")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, e := range es {
			if _, err := s.Delete(ctx, ks, e.Key, spate.AnyRevision); err != nil {
				errs = append(errs, fmt.Errorf("delete %s key %q: %w", ks, e.Key, err))
			}
		}
	}
	return errors.Join(errs...)
}

func (d *deployment) Close() error {
	d.mu.Lock()
	jobs := d.jobs
	d.jobs = map[string]*Store{}
	d.closed = true
	d.mu.Unlock()
	for _, s := range jobs {
		_ = s.Close()
	}
	return nil
}
