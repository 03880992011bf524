package etcd

import (
	"context"
	"fmt"
	"time"

	"github.com/spate-go/spate"
	"github.com/spate-go/spate/internal/version"
)

// MinServerVersion is the oldest etcd server the driver accepts: the oldest
// release line the etcd project still maintains. The driver is tested
// against the v3.7 server it embeds.
const MinServerVersion = "3.5.0"

// statusTimeout bounds the version query to one endpoint.
const statusTimeout = 2 * time.Second

// checkServerVersion asks every endpoint for its server version and refuses
// the store, with a Fatal error that says to upgrade, if any member that
// answers runs a release older than [MinServerVersion] (a cluster midway
// through an upgrade from an unsupported release is refused too). Members
// that do not answer are skipped: the startup check has already proved the
// cluster serves reads, and a member that is down cannot serve us.
func (s *store) checkServerVersion(ctx context.Context) error {
	answered := 0
	for _, ep := range s.cli.Endpoints() {
		sctx, cancel := context.WithTimeout(ctx, statusTimeout)
		st, err := s.cli.Status(sctx, ep)
		cancel()
		if err != nil {
			s.log.Debug("etcd: no server version from this endpoint; skipping it", "endpoint", ep, "err", err)
			continue
		}
		answered++
		old, err := version.Older(st.Version, MinServerVersion)
		if err != nil {
			return fmt.Errorf("etcd: startup check: endpoint %s reports server version %q, which is not a release number: %w",
				ep, st.Version, spate.ErrFatal)
		}
		if old {
			return fmt.Errorf("etcd: startup check: endpoint %s runs etcd %s; the driver needs %s or newer: upgrade the cluster: %w",
				ep, st.Version, MinServerVersion, spate.ErrFatal)
		}
	}
	if answered == 0 {
		s.log.Warn("etcd: no endpoint reported its server version; the version check was skipped",
			"endpoints", s.cli.Endpoints(), "min_version", MinServerVersion)
	}
	return nil
}
