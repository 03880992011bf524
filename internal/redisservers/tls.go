package redisservers

import (
	"crypto/tls"

	"github.com/spate-go/spate/internal/testcerts"
)

// tlsFiles is a throwaway CA, a server certificate for 127.0.0.1 and
// localhost, and a client certificate: PEM files for the server, a
// tls.Config for clients.
type tlsFiles struct {
	caCert, serverCert, serverKey string
	clientConfig                  *tls.Config
}

func writeTLSFiles(dir string) (*tlsFiles, error) {
	ca, err := testcerts.New(dir, "redistest")
	if err != nil {
		return nil, err
	}
	srv, err := ca.Server("redistest-server")
	if err != nil {
		return nil, err
	}
	cli, err := ca.Client("redistest-client")
	if err != nil {
		return nil, err
	}
	cfg := ca.ClientConfig(&cli)
	cfg.ServerName = "localhost"
	return &tlsFiles{caCert: ca.CertFile, serverCert: srv.CertFile, serverKey: srv.KeyFile, clientConfig: cfg}, nil
}
