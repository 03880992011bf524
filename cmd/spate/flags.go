package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/embedetcd"
	"github.com/spate-go/spate/pipeline/filesource"
	"github.com/spate-go/spate/storeurl"
)

// maxThreads caps --threads: every pipeline thread is a lane runner goroutine
// with its own buffers, and far more of them than CPUs only costs memory.
const maxThreads = 256

// embeddedLeaseFloor is the default store's smallest lease: etcd's floor
// of 1.5 election timeouts, rounded up to whole seconds.
var embeddedLeaseFloor = (time.Duration(3*embedetcd.ProductionElectionMs/2)*time.Millisecond + time.Second - 1).Truncate(time.Second)

// flagError is a bad flag: its message names the flag, in one line.
type flagError struct{ msg string }

func (e *flagError) Error() string { return e.msg }

func flagErrorf(format string, args ...any) error {
	return &flagError{msg: fmt.Sprintf(format, args...)}
}

// checkFlags runs the checks in order and returns the first failure.
func checkFlags(checks ...func() error) error {
	for _, c := range checks {
		if err := c(); err != nil {
			return err
		}
	}
	return nil
}

// explicitlySet reports whether the command line set the flag.
func explicitlySet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}

func positive(name string, d time.Duration) error {
	if d <= 0 {
		return flagErrorf("--%s %v: must be positive", name, d)
	}
	return nil
}

func atLeast(name string, v, lo int64) error {
	if v < lo {
		return flagErrorf("--%s %d: must be at least %d", name, v, lo)
	}
	return nil
}

func noPositional(pos []string) error {
	if len(pos) > 0 {
		return flagErrorf("unexpected argument %q (every value is given with a flag)", pos[0])
	}
	return nil
}

func required(name, value, what string) error {
	if value == "" {
		return flagErrorf("--%s is required: %s", name, what)
	}
	return nil
}

// checkLease checks a lease against the protocol's floor and the store's
// resolution, and the timings derived from it.
func checkLease(name string, lease time.Duration, store storeurl.Info) error {
	if lease < spate.MinLeaseDuration {
		return flagErrorf("--%s %v: must be at least %v", name, lease, spate.MinLeaseDuration)
	}
	if r := store.TTLResolution; r > 0 && lease%r != 0 {
		if r == time.Second {
			return flagErrorf("--%s %v: %s leases are whole seconds", name, lease, store.Driver)
		}
		return flagErrorf("--%s %v: %s leases are multiples of %v", name, lease, store.Driver, r)
	}
	cfg := spate.TimingsForLease(lease)
	cfg.InstanceID = "check"
	if err := cfg.Validate(); err != nil {
		return flagErrorf("--%s %v: %s", name, lease, strings.ReplaceAll(strings.TrimPrefix(err.Error(), "spate: "), "\n", "; "))
	}
	return nil
}

// checkAddr checks a host:port flag.
func checkAddr(name, addr string) error {
	if addr == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return flagErrorf("--%s %q: want host:port (%v)", name, addr, err)
	}
	return nil
}

// validate checks the store flags without reaching the store or creating
// anything, and describes the store (an etcd for the default store).
func (f *storeFlags) validate() (storeurl.Info, error) {
	if err := positive("connect-timeout", f.connectTimeout); err != nil {
		return storeurl.Info{}, err
	}
	if f.url == "" {
		if f.dataDir == "" {
			return storeurl.Info{}, flagErrorf("--data-dir is empty: the default store needs a data directory")
		}
		if err := checkAddr("embed-addr", f.embedAddr); err != nil {
			return storeurl.Info{}, err
		}
		return storeurl.Info{Driver: "etcd", TTLResolution: time.Second, MinTTL: embeddedLeaseFloor}, nil
	}
	// Connecting to a store URL only parses it (and reads the secret and
	// TLS files): nothing is dialled or created.
	c, err := f.connect(context.Background(), nil, connectExisting)
	if err != nil {
		return storeurl.Info{}, flagErrorf("%s", strings.TrimPrefix(err.Error(), "spate: "))
	}
	c.close()
	return c.info, nil
}

// validate checks every backfill flag without reaching the store or
// creating anything: a bad flag is a one-line error naming it. The checks
// run in flag order, grouped by what the flags set; the first failure is
// the one reported.
func (f *backfillFlags) validate(fs *flag.FlagSet, pos []string) error {
	var store storeurl.Info
	if !explicitlySet(fs, "commit-interval") {
		f.commitInterval = min(f.commitInterval, f.lease) // a short lease commits at least once per lease
	}
	return checkFlags(
		func() error { return noPositional(pos) },
		func() error { return required("src", f.src, "the directory (or bucket URL) to copy") },
		func() error { return required("dst", f.dst, "the directory to write the output to") },
		func() (err error) { store, err = f.store.validate(); return err },
		func() error { return f.checkTimings(store) },
		func() error { return f.checkSizes() },
		func() error { return f.checkFollow(fs) },
		func() error { return f.checkTable(fs) },
		func() error { return f.checkNames() },
		func() error { return checkAddr("metrics-addr", f.metricsAddr) },
		func() error { return checkParentDir("history", f.history) },
		func() error { return f.log.validate() },
		func() error { return checkDstDir(f.dst) },
	)
}

// checkTimings checks the lease and the intervals derived from it against
// the store's lease resolution.
func (f *backfillFlags) checkTimings(store storeurl.Info) error {
	return checkFlags(
		func() error { return checkLease("lease", f.lease, store) },
		func() error {
			if f.store.url == "" && f.lease < embeddedLeaseFloor {
				return flagErrorf("--lease %v: the default store (an embedded etcd) grants leases of at least %v", f.lease, embeddedLeaseFloor)
			}
			return nil
		},
		func() error { return positive("commit-interval", f.commitInterval) },
		func() error {
			if f.commitInterval > f.lease {
				return flagErrorf("--commit-interval %v is longer than --lease %v: commit at least once per lease, "+
					"or a takeover replays more than a lease of work", f.commitInterval, f.lease)
			}
			return nil
		},
		func() error { return positive("drain-timeout", f.drainTimeout) },
		func() error { return positive("roll-interval", f.rollInterval) },
		func() error {
			if f.rollSize <= 0 {
				return flagErrorf("--roll-size %d: must be positive", f.rollSize)
			}
			return nil
		},
		func() error {
			if f.rebalanceDelay < 0 {
				return flagErrorf("--rebalance-delay %v: must not be negative (0 reassigns at once)", f.rebalanceDelay)
			}
			return nil
		},
	)
}

// checkSizes checks the counts: lanes, threads, attempts, split sizes.
func (f *backfillFlags) checkSizes() error {
	return checkFlags(
		func() error { return atLeast("lanes", int64(f.lanes), 1) },
		func() error {
			if f.threads < 1 || f.threads > maxThreads {
				return flagErrorf("--threads %d: must be between 1 and %d", f.threads, maxThreads)
			}
			return nil
		},
		func() error { return atLeast("max-attempts", int64(f.maxAttempts), 1) },
		func() error { return atLeast("split-bytes", f.splitBytes, 1) },
		func() error { return atLeast("split-files", int64(f.splitFiles), 1) },
		func() error { return atLeast("min-splits", int64(f.minSplits), 1) },
		func() error { return atLeast("max-line-bytes", int64(f.maxLineBytes), 1) },
	)
}

// The values of --publish.
const (
	publishCommit   = "commit"
	publishComplete = "complete"
)

// defaultPublish is --publish when it is not given: a bounded job's
// directory output is published whole (each byte written once); a
// followed job's, whose splits complete only at --until-idle, at every
// commit. A bucket --dst publishes parts and ignores it.
func (f *backfillFlags) defaultPublish() string {
	if f.follow || isBucketURL(f.dst) {
		return publishCommit
	}
	return publishComplete
}

// checkFollow checks the flags of a continuous job, --publish and the
// read rate.
func (f *backfillFlags) checkFollow(fs *flag.FlagSet) error {
	if f.publish == "" {
		f.publish = f.defaultPublish()
	}
	switch {
	case !f.follow && explicitlySet(fs, "until-idle"):
		return flagErrorf("--until-idle needs --follow")
	case !f.follow && explicitlySet(fs, "discover"):
		return flagErrorf("--discover needs --follow")
	case !f.follow && explicitlySet(fs, "retain"):
		return flagErrorf("--retain needs --follow")
	case f.retain == 0:
		return flagErrorf("--retain 0s: must be positive (a negative value keeps the splits of files that are gone forever)")
	case f.untilIdle < 0:
		return flagErrorf("--until-idle %v: must not be negative (0 runs until stopped)", f.untilIdle)
	case f.discover < 0 || f.discover > 0 && f.discover < minDiscover:
		return flagErrorf("--discover %v: must be at least %v (0: --lease)", f.discover, minDiscover)
	case f.include.err != nil:
		return flagErrorf("--include: %v", f.include.err)
	case f.exclude.err != nil:
		return flagErrorf("--exclude: %v", f.exclude.err)
	case f.publish != publishCommit && f.publish != publishComplete:
		return flagErrorf("--publish %q: must be %s (the file grows at every commit) or %s (it appears whole when its split completes)", f.publish, publishCommit, publishComplete)
	case f.publish == publishComplete && f.follow:
		return flagErrorf("--publish %s needs a bounded job: a followed file's split completes only at --until-idle, so its output would stay unpublished; drop --follow or use --publish %s", publishComplete, publishCommit)
	case f.publish == publishComplete && isBucketURL(f.dst):
		return flagErrorf("--publish applies to a directory --dst; a bucket --dst publishes parts (see --roll-size)")
	case math.IsNaN(f.rate) || math.IsInf(f.rate, 0) || f.rate < 0:
		return flagErrorf("--rate %v: must be 0 (unlimited) or a positive number of lines per second", f.rate)
	}
	return nil
}

// checkNames checks the job name and the instance id, when given.
func (f *backfillFlags) checkNames() error {
	if f.job != "" {
		if err := validateJob(f.job); err != nil {
			return flagErrorf("--job: %v", err)
		}
	}
	if f.instance != "" {
		if err := spate.ValidateInstanceID(f.instance); err != nil {
			return flagErrorf("--instance %q: %s", f.instance, strings.TrimPrefix(err.Error(), "spate: "))
		}
	}
	return nil
}

// checkDstDir checks that --dst, when it exists, is a directory.
func checkDstDir(dst string) error {
	abs, err := filepath.Abs(dst)
	if err != nil {
		return flagErrorf("--dst: %v", err)
	}
	if st, err := os.Stat(abs); err == nil && !st.IsDir() {
		return flagErrorf("--dst %s is not a directory", dst)
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return flagErrorf("--dst: %v", err)
	}
	return nil
}

// checkParentDir checks that a file flag's directory exists.
func checkParentDir(name, path string) error {
	if path == "" {
		return nil
	}
	dir := filepath.Dir(path)
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return flagErrorf("--%s %s: no directory %s", name, path, dir)
	}
	return nil
}

// minDiscover is --discover's floor: a listing of --src at most this often.
const minDiscover = 100 * time.Millisecond

// patternList is a repeatable glob flag (--include, --exclude). An empty
// value counts as given (so --exclude ” replaces the defaults) and adds
// no pattern.
type patternList struct {
	list []string
	set  bool
	err  error // the first bad pattern
}

func (p *patternList) String() string {
	if p == nil {
		return ""
	}
	return strings.Join(p.list, ",")
}

func (p *patternList) Set(v string) error {
	p.set = true
	if v == "" {
		return nil
	}
	if err := filesource.ValidatePatterns([]string{v}); err != nil && p.err == nil {
		p.err = err
	}
	p.list = append(p.list, v)
	return nil
}

func (p *patternList) patterns() []string { return p.list }
