package broker

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
)

// redisTLS completes tc, the TLS configuration go-redis made for a
// rediss:// URL (nil for redis://), with the configured CA and client
// certificate. TLS files with a redis:// URL are an error: the operator
// meant TLS and would not get it.
func (cfg RedisConfig) redisTLS(tc *tls.Config) error {
	if tc != nil && tc.MinVersion == 0 {
		tc.MinVersion = tls.VersionTLS12 // ParseClusterURL leaves it at TLS 1.0
	}
	if cfg.TLSCA == "" && cfg.TLSCert == "" && cfg.TLSKey == "" {
		return nil
	}
	if tc == nil {
		return errors.New("redis: TLSCA, TLSCert or TLSKey (--redis-tls-ca, --redis-tls-cert, --redis-tls-key) set with a redis:// URL: use rediss:// for TLS")
	}
	if cfg.TLSCA != "" {
		pool, err := loadCAPool(cfg.TLSCA)
		if err != nil {
			return fmt.Errorf("redis: TLSCA (--redis-tls-ca) %s: %w", cfg.TLSCA, err)
		}
		tc.RootCAs = pool
	}
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return errors.New("redis: TLSCert (--redis-tls-cert) and TLSKey (--redis-tls-key) go together: give both or neither")
	}
	if cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return fmt.Errorf("redis: TLSCert (--redis-tls-cert) %s, TLSKey (--redis-tls-key) %s: %w", cfg.TLSCert, cfg.TLSKey, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return nil
}

// redisHint says which part of the configuration a refused connection
// points at.
func redisHint(err error) string {
	var unknownCA x509.UnknownAuthorityError
	var badHost x509.HostnameError
	msg := err.Error()
	switch {
	case strings.HasPrefix(msg, "WRONGPASS"), strings.HasPrefix(msg, "NOAUTH"), strings.Contains(msg, "AUTH <password> called without any password configured"):
		return " (the server refused the credentials: the user and password go in --redis-url, redis[s]://user:password@host:port)"
	case errors.As(err, &unknownCA), errors.As(err, &badHost):
		return " (the server's certificate is not trusted: --redis-tls-ca names the CA that issued it)"
	}
	return ""
}
