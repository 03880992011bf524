package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a throwaway certificate authority for tests. Its key never leaves
// the process; the certificates it signs are written to files because the
// embedded etcd server reads its TLS material from disk.
type CA struct {
	Cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
	dir     string
	serial  int64
}

// Pair is a certificate and key the CA signed, in memory and on disk.
type Pair struct {
	CertFile, KeyFile string
	TLS               tls.Certificate
}

// NewCA makes a fresh CA named name whose files go to dir.
func NewCA(dir, name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name, Organization: []string{"spate tests"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &CA{Cert: cert, key: key, certPEM: pemBlock("CERTIFICATE", der), dir: dir, serial: 1}
	if err := os.WriteFile(ca.CertFile(), ca.certPEM, 0o600); err != nil {
		return nil, err
	}
	return ca, nil
}

// CertFile is the path of the CA certificate (PEM).
func (ca *CA) CertFile() string { return filepath.Join(ca.dir, ca.Cert.Subject.CommonName+"-ca.pem") }

// Pool is a cert pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Server issues a server certificate for 127.0.0.1, ::1 and localhost.
func (ca *CA) Server(name string) (Pair, error) {
	return ca.issue(name, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
}

// Client issues a client certificate with common name cn.
func (ca *CA) Client(cn string) (Pair, error) {
	return ca.issue(cn, x509.ExtKeyUsageClientAuth)
}

func (ca *CA) issue(cn string, usage ...x509.ExtKeyUsage) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	ca.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial),
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"spate tests"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  usage,
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return Pair{}, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	certPEM, keyPEM := pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", keyDER)
	base := filepath.Join(ca.dir, fmt.Sprintf("%s-%s-%d", ca.Cert.Subject.CommonName, cn, ca.serial))
	p := Pair{CertFile: base + ".pem", KeyFile: base + "-key.pem"}
	if err := os.WriteFile(p.CertFile, certPEM, 0o600); err != nil {
		return Pair{}, err
	}
	if err := os.WriteFile(p.KeyFile, keyPEM, 0o600); err != nil {
		return Pair{}, err
	}
	p.TLS, err = tls.X509KeyPair(certPEM, keyPEM)
	return p, err
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}
