package main

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"time"
)

// natsSchemes is appended to the list of known schemes in errors.
const natsSchemes = ""

// natsConnector reaches a NATS deployment. The stores/nats driver is not
// part of this build yet: nats:// URLs are refused.
type natsConnector struct{}

func newNatsConnector(raw string, _ *tls.Config, _, _, _, _ string) (*natsConnector, error) {
	return nil, errors.New("--store " + raw + ": the NATS driver (stores/nats) is not in this build yet")
}

func (n *natsConnector) describe() string { return "nats" }
func (n *natsConnector) close()           {}
func (n *natsConnector) open(context.Context, string, time.Duration, *slog.Logger) (*openedStore, error) {
	return nil, errors.New("nats: not in this build")
}
func (n *natsConnector) deleteNamespace(context.Context, string) error { return nil }
func (n *natsConnector) jobs(context.Context) ([]string, error)        { return nil, nil }
