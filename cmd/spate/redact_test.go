package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRedactStoreURL(t *testing.T) {
	cases := map[string]string{
		"nats://s3cret@127.0.0.1:4222":                          "nats://xxxxx@127.0.0.1:4222",
		"nats://alice:s3cret@a:4222,nats://alice:s3cret@b:4222": "nats://alice:xxxxx@a:4222,nats://alice:xxxxx@b:4222",
		"tls://alice:s3cret@a:4222?replicas=3":                  "tls://alice:xxxxx@a:4222?replicas=3",
		"redis://default:s3cret@127.0.0.1:6379/2":               "redis://default:xxxxx@127.0.0.1:6379/2",
		"rediss://:s3cret@host:6380":                            "rediss://:xxxxx@host:6380",
		"etcd://root:s3cret@h1:2379,h2:2379":                    "etcd://root:xxxxx@h1:2379,h2:2379",
		"etcd://h1:2379,h2:2379":                                "etcd://h1:2379,h2:2379",
		"nats://127.0.0.1:4222":                                 "nats://127.0.0.1:4222",
		"mem://":                                                "mem://",
		"redis://h:6379/0?user=a@b":                             "redis://h:6379/0?user=a@b",
	}
	for in, want := range cases {
		assert.Equal(t, want, redactStoreURL(in), "redactStoreURL(%q)", in)
	}
}

// No secret in a store URL reaches what the CLI prints or records: the
// store's description (stdout, inspect, the history file, retry lines),
// the errors of a bad URL, and the commands it suggests.
func TestStoreSecretsAreNeverShown(t *testing.T) {
	const secret = "s3cret-do-not-print"
	for _, raw := range []string{
		"nats://" + secret + "@127.0.0.1:1",
		"nats://alice:" + secret + "@127.0.0.1:1,nats://alice:" + secret + "@127.0.0.2:1",
		"tls://alice:" + secret + "@127.0.0.1:1",
		"redis://default:" + secret + "@127.0.0.1:1/0",
		"etcd://root:" + secret + "@127.0.0.1:1",
	} {
		f := &storeFlags{url: raw}
		c, err := f.connect(context.Background(), slog.New(slog.DiscardHandler), connectStart)
		require.NoError(t, err, raw)
		assert.NotContains(t, c.describe, secret, "the store's description shows the secret of %s", redactStoreURL(raw))
		bf := &backfillFlags{store: *f}
		assert.NotContains(t, bf.storeArgs("job"), secret, "a suggested command shows the secret of %s", redactStoreURL(raw))
	}
	for _, raw := range []string{
		"nats://alice:" + secret + "@127.0.0.1:1?replicas=2",
		"nats://alice:" + secret + "@127.0.0.1:1?bogus=1",
		"bogus://alice:" + secret + "@127.0.0.1:1",
		"redis://alice:" + secret + "@127.0.0.1:notaport/x/y",
	} {
		_, err := (&storeFlags{url: raw}).connect(context.Background(), slog.New(slog.DiscardHandler), connectStart)
		require.Error(t, err, raw)
		assert.False(t, strings.Contains(err.Error(), secret), "the error for a bad URL shows its secret: %v", err)
	}
}
