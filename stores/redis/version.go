package redis

import (
	"context"
	"fmt"
	"strings"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/version"
)

// MinServerVersion is the oldest Redis the driver accepts. The write scripts
// read TIME before they write, which replicates correctly only as script
// effects; from Redis 7.0 that is the only mode, while older servers could be
// configured to replicate scripts verbatim (lua-replicate-commands no), and a
// replica replaying such a script would compute other expiry times. The
// change log also relies on streams with caller-chosen ids. The driver is
// tested against Redis 7.0.
const MinServerVersion = "7.0.0"

// checkServerVersion refuses a server older than [MinServerVersion] with a
// Fatal error that says so. A server that will not answer INFO (denied by
// ACL, or renamed away as some managed services do) is let through with a
// warning: the script checks that follow still refuse a server that cannot
// run the driver.
func (s *store) checkServerVersion(ctx context.Context) error {
	// One round trip: INFO without a section answers the default sections,
	// server and memory among them, on every Redis version.
	info, err := s.c.Info(ctx).Result()
	if err != nil {
		msg := err.Error()
		if errorCode(msg) == "NOPERM" || strings.HasPrefix(msg, "ERR unknown command") {
			s.log.Warn("cannot read the server version (INFO is denied or renamed); skipping the version check",
				"min_version", MinServerVersion, "error", msg)
			// Unverified is unmet: a server whose persistence nobody could
			// read must not pass for one that has it.
			s.unmet = []string{fmt.Sprintf("appendonly yes and appendfsync always (not verified: INFO is denied or renamed: %s; "+
				"grant the driver's user +info and +config|get, as the documented ACL does)", msg)}
			for _, u := range s.unmet {
				s.log.Warn("cannot verify a setting the driver's durability depends on", "setting", u)
			}
			return nil
		}
		return s.startupError(ctx, "info", err)
	}
	v, ok := infoField(info, "redis_version")
	if !ok {
		return fmt.Errorf("redis: job %q: INFO reports no redis_version; is this a Redis server?: %w",
			s.opts.Job, spate.ErrFatal)
	}
	old, err := version.Older(v, MinServerVersion)
	if err != nil {
		return fmt.Errorf("redis: job %q: cannot parse the server version %q: %w", s.opts.Job, v, spate.ErrFatal)
	}
	if old {
		return fmt.Errorf("redis: job %q: the server runs Redis %s; the driver needs %s or newer (scripts that read TIME "+
			"must replicate as effects): upgrade the server: %w", s.opts.Job, v, MinServerVersion, spate.ErrFatal)
	}
	if err := s.checkEviction(info); err != nil {
		return err
	}
	s.checkPersistence(ctx, info)
	return nil
}

// checkPersistence records, and warns about, persistence settings the
// driver's durability depends on and the server does not meet: without
// the append-only file a restart loses every write since the last
// snapshot (committed progress goes back, or the whole job vanishes), and
// without appendfsync always a crash loses the last second of
// acknowledged writes. The job still runs: a scratch server is a fair
// choice for a throwaway job, but it must be a choice.
func (s *store) checkPersistence(ctx context.Context, info string) {
	var unmet []string
	switch aof, ok := infoField(info, "aof_enabled"); {
	case !ok:
		unmet = append(unmet, "appendonly yes (not verified: INFO has no aof_enabled)")
	case aof != "1":
		unmet = append(unmet, "appendonly yes (the server has appendonly no: a restart loses every write since the last RDB snapshot)")
	default:
		vals, err := s.c.ConfigGet(ctx, "appendfsync").Result()
		switch {
		case err != nil:
			unmet = append(unmet, fmt.Sprintf("appendfsync always (not verified: CONFIG GET is denied or renamed: %v)", err))
		case vals["appendfsync"] != "always":
			unmet = append(unmet, fmt.Sprintf("appendfsync always (the server has appendfsync %s: a crash loses acknowledged writes)", vals["appendfsync"]))
		}
	}
	s.unmet = unmet
	for _, u := range unmet {
		s.log.Warn("the server does not meet a setting the driver's durability depends on; committed progress may be lost on a restart or crash",
			"setting", u)
	}
}

// checkEviction refuses a server that may evict the job's keys. The driver
// keeps every key without a Redis TTL (it expires ephemeral keys itself), so
// only the allkeys-* policies can drop them, and only once maxmemory is set
// and reached: an evicted split record or plan is lost progress and a broken
// fence, so such a server is refused up front rather than when memory runs
// short. The volatile-* policies and noeviction never touch the job's keys
// (a full server then fails writes, which the driver reports as errors).
func (s *store) checkEviction(info string) error {
	policy, _ := infoField(info, "maxmemory_policy")
	limit, _ := infoField(info, "maxmemory")
	if strings.HasPrefix(policy, "allkeys-") && limit != "" && limit != "0" {
		return fmt.Errorf("redis: job %q: the server may evict any key (maxmemory %s bytes with maxmemory-policy %s), "+
			"which would silently drop the job's durable state: set maxmemory-policy to noeviction (or a volatile-* policy), "+
			"or use a Redis that is not a cache: %w", s.opts.Job, limit, policy, spate.ErrFatal)
	}
	return nil
}

// infoField finds "name:value" in an INFO reply.
func infoField(info, name string) (string, bool) {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), name+":"); ok {
			return v, true
		}
	}
	return "", false
}
