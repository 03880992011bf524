package storeurl

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
)

// Secret is a credential given by value, by a file that holds it, or by
// an environment variable: [Secret.Resolve] takes the first of Value,
// File and Env that is set. It formats (fmt, log/slog) as "xxxxx" when
// set, so an Options value can be printed.
type Secret struct {
	// Value is the secret itself.
	Value string
	// File names a file holding the secret; one trailing newline (\n or
	// \r\n) is trimmed.
	File string
	// Env names an environment variable holding the secret; an unset or
	// empty variable yields no value.
	Env string
}

// Resolve returns the secret, "" when none of its sources yields one. An
// unreadable or empty file is an error.
func (s Secret) Resolve() (string, error) {
	switch {
	case s.Value != "":
		return s.Value, nil
	case s.File != "":
		b, err := os.ReadFile(s.File)
		if err != nil {
			return "", fmt.Errorf("read the secret file: %w", err)
		}
		v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if v == "" {
			return "", fmt.Errorf("the secret file %s is empty", s.File)
		}
		return v, nil
	case s.Env != "":
		return os.Getenv(s.Env), nil
	}
	return "", nil
}

// IsZero reports whether no source is set.
func (s Secret) IsZero() bool { return s == Secret{} }

// String masks the secret: "xxxxx", or "" when no source is set.
func (s Secret) String() string {
	if s.IsZero() {
		return ""
	}
	return "xxxxx"
}

// GoString masks the secret in %#v.
func (s Secret) GoString() string { return fmt.Sprintf("storeurl.Secret(%q)", s.String()) }

// LogValue masks the secret in log/slog.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// LoadTLS returns base (or, when base is nil, a configuration requiring
// TLS 1.2) with a CA file's certificates as its roots and a client
// certificate and key loaded from PEM files; files that are "" are left
// out. It returns base itself when every file is "" (nil when base is
// nil too: no TLS asked for). base is never modified.
func LoadTLS(base *tls.Config, caFile, certFile, keyFile string) (*tls.Config, error) {
	if caFile == "" && certFile == "" && keyFile == "" {
		return base, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if base != nil {
		cfg = base.Clone()
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", ParamCAFile, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s %s holds no PEM certificate", ParamCAFile, caFile)
		}
		cfg.RootCAs = pool
	}
	if (certFile == "") != (keyFile == "") {
		return nil, errors.New(ParamCertFile + " and " + ParamKeyFile + " go together")
	}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("%s/%s: %w", ParamCertFile, ParamKeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}
