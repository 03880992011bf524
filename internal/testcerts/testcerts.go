// Package testcerts makes throwaway TLS material for tests: a CA, server
// certificates for loopback, and client certificates, written as PEM files
// (servers and CLIs want files) and available as tls.Configs.
package testcerts

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
	"testing"
	"time"
)

// CA is a throwaway certificate authority.
type CA struct {
	Dir      string // where the PEM files live
	CertFile string // the CA certificate
	cert     *x509.Certificate
	key      *ecdsa.PrivateKey
}

// Pair is an issued certificate with its key, as files and in memory.
type Pair struct {
	CertFile, KeyFile string
	TLS               tls.Certificate
}

// NewCA makes a CA named name in a temp directory of t.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	ca, err := New(t.TempDir(), name)
	if err != nil {
		t.Fatalf("testcerts: %v", err)
	}
	return ca
}

// New makes a CA whose files go to dir.
func New(dir, name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caSerial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          caSerial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &CA{Dir: dir, CertFile: filepath.Join(dir, name+"-ca.pem"), cert: cert, key: key}
	if err := os.WriteFile(ca.CertFile, pemOf("CERTIFICATE", der), 0o600); err != nil {
		return nil, err
	}
	return ca, nil
}

// Pool is a cert pool trusting only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Server issues a certificate for localhost and 127.0.0.1.
func (ca *CA) Server(name string) (Pair, error) {
	return ca.issue(name, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
}

// Client issues a client certificate with common name cn.
func (ca *CA) Client(cn string) (Pair, error) { return ca.issue(cn, x509.ExtKeyUsageClientAuth) }

// MustServer and MustClient fail t on error.
func (ca *CA) MustServer(t testing.TB, name string) Pair {
	t.Helper()
	p, err := ca.Server(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// MustClient issues a client certificate or fails t.
func (ca *CA) MustClient(t testing.TB, cn string) Pair {
	t.Helper()
	p, err := ca.Client(cn)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// ClientConfig trusts the CA and presents pair (if non-nil).
func (ca *CA) ClientConfig(pair *Pair) *tls.Config {
	c := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}
	if pair != nil {
		c.Certificates = []tls.Certificate{pair.TLS}
	}
	return c
}

func (ca *CA) issue(cn string, usage ...x509.ExtKeyUsage) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	// Random serials: two throwaway CAs of one name must not issue
	// certificates that collide on issuer and serial.
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return Pair{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  usage,
		DNSNames:     []string{"localhost", cn},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return Pair{}, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	certPEM, keyPEM := pemOf("CERTIFICATE", der), pemOf("EC PRIVATE KEY", kder)
	p := Pair{CertFile: filepath.Join(ca.Dir, cn+".pem"), KeyFile: filepath.Join(ca.Dir, cn+"-key.pem")}
	if err := os.WriteFile(p.CertFile, certPEM, 0o600); err != nil {
		return Pair{}, err
	}
	if err := os.WriteFile(p.KeyFile, keyPEM, 0o600); err != nil {
		return Pair{}, err
	}
	p.TLS, err = tls.X509KeyPair(certPEM, keyPEM)
	return p, err
}

func pemOf(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
