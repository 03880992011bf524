package natsservers

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"

	"github.com/spate-go/spate/internal/testcerts"
)

// makeTLS makes a throwaway CA, a server certificate for 127.0.0.1 and
// localhost and a client certificate, writes them as PEM files and sets the
// client options.
func (s *Server) makeTLS(dir string) error {
	ca, err := testcerts.New(dir, "natstest")
	if err != nil {
		return err
	}
	s.CAFile = ca.CertFile
	if _, err := ca.Server("server"); err != nil {
		return err
	}
	cli, err := ca.Client("client")
	if err != nil {
		return err
	}
	s.CertFile, s.KeyFile = cli.CertFile, cli.KeyFile
	s.ClientOptions = append(s.ClientOptions, s.tlsClientOptions()...)
	return nil
}

func (s *Server) tlsClientOptions() []natsgo.Option {
	if !s.cfg.tls {
		return nil
	}
	opts := []natsgo.Option{natsgo.RootCAs(s.CAFile)}
	if s.cfg.mutualTLS {
		opts = append(opts, natsgo.ClientCert(s.CertFile, s.KeyFile))
	}
	return opts
}

func (s *Server) applyTLS(o *server.Options) error {
	dir := filepath.Dir(s.CAFile)
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem"))
	if err != nil {
		return err
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if s.cfg.mutualTLS {
		caPEM, err := os.ReadFile(s.CAFile)
		if err != nil {
			return err
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(caPEM)
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		o.TLSVerify = true
	}
	o.TLS = true
	o.TLSConfig = cfg
	o.TLSTimeout = 5
	return nil
}
