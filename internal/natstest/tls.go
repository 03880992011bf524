package natstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
)

// makeTLS makes a throwaway CA, a server certificate for 127.0.0.1 and
// localhost and a client certificate, writes them as PEM files and sets the
// client options.
func (s *Server) makeTLS(dir string) error {
	caKey, caCert, caDER, err := newCA()
	if err != nil {
		return err
	}
	if s.CAFile, err = writeFile(dir, "ca.pem", pemBlock("CERTIFICATE", caDER)); err != nil {
		return err
	}
	if _, _, err = s.leaf(dir, "server", caKey, caCert, x509.ExtKeyUsageServerAuth); err != nil {
		return err
	}
	if s.CertFile, s.KeyFile, err = s.leaf(dir, "client", caKey, caCert, x509.ExtKeyUsageClientAuth); err != nil {
		return err
	}
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

func newCA() (*ecdsa.PrivateKey, *x509.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "natstest CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return key, cert, der, err
}

// leaf makes a certificate signed by the CA and writes cert and key files.
func (s *Server) leaf(dir, name string, caKey *ecdsa.PrivateKey, ca *x509.Certificate, usage x509.ExtKeyUsage) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "natstest " + name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return "", "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	if certFile, err = writeFile(dir, name+".pem", pemBlock("CERTIFICATE", der)); err != nil {
		return "", "", err
	}
	keyFile, err = writeFile(dir, name+"-key.pem", pemBlock("EC PRIVATE KEY", keyDER))
	return certFile, keyFile, err
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
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
