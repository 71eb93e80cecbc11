package broker

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// secureOptions turns NATSConfig's credential and TLS files into client
// options. Every file is read and parsed here, before anything dials, so
// that a missing, unreadable or malformed file fails at start with an error
// naming the field, its flag and the file, not as an authorization
// violation from the server.
func (cfg NATSConfig) secureOptions() ([]nats.Option, error) {
	var opts []nats.Option
	if cfg.CredsFile != "" && cfg.NKeyFile != "" {
		return nil, errors.New("nats: CredsFile (--nats-creds) and NKeyFile (--nats-nkey) are two ways to be one user: give one")
	}
	if cfg.CredsFile != "" {
		if err := checkCreds(cfg.CredsFile); err != nil {
			return nil, fmt.Errorf("nats: CredsFile (--nats-creds) %s: %w", cfg.CredsFile, err)
		}
		// The library reads the file again at each (re)connect: a rotated
		// file is used from the next connection on.
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.NKeyFile != "" {
		opt, err := nats.NkeyOptionFromSeed(cfg.NKeyFile)
		if err != nil {
			return nil, fmt.Errorf("nats: NKeyFile (--nats-nkey) %s: %w", cfg.NKeyFile, err)
		}
		opts = append(opts, opt)
	}
	tc, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	if tc != nil {
		opts = append(opts, nats.Secure(tc))
	}
	return opts, nil
}

// checkCreds checks that path holds a user JWT and a user seed, as
// nats.UserCredentials will want them.
func checkCreds(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	defer clear(b)
	// ParseDecoratedJWT returns what it was given when it finds no
	// decorated JWT: decoding says whether that is a user's JWT.
	j, err := nkeys.ParseDecoratedJWT(b)
	if err == nil {
		_, err = jwt.DecodeUserClaims(j)
	}
	if err != nil {
		return fmt.Errorf("no user JWT: %w", err)
	}
	kp, err := nkeys.ParseDecoratedUserNKey(b)
	if err != nil {
		return fmt.Errorf("no user NKey seed: %w", err)
	}
	kp.Wipe()
	return nil
}

// tlsConfig builds the client TLS configuration, or nil when no TLS file
// is given (a tls:// URL then still connects with TLS and the system's
// roots).
func (cfg NATSConfig) tlsConfig() (*tls.Config, error) {
	if cfg.TLSCA == "" && cfg.TLSCert == "" && cfg.TLSKey == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.TLSCA != "" {
		pool, err := loadCAPool(cfg.TLSCA)
		if err != nil {
			return nil, fmt.Errorf("nats: TLSCA (--nats-tls-ca) %s: %w", cfg.TLSCA, err)
		}
		tc.RootCAs = pool
	}
	if (cfg.TLSCert == "") != (cfg.TLSKey == "") {
		return nil, errors.New("nats: TLSCert (--nats-tls-cert) and TLSKey (--nats-tls-key) go together: give both or neither")
	}
	if cfg.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(cfg.TLSCert, cfg.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("nats: TLSCert (--nats-tls-cert) %s, TLSKey (--nats-tls-key) %s: %w", cfg.TLSCert, cfg.TLSKey, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// connectHint says which flags a refused connection points at.
func connectHint(err error) string {
	var unknownCA x509.UnknownAuthorityError
	var badHost x509.HostnameError
	switch {
	case errors.Is(err, nats.ErrAuthorization), errors.Is(err, nats.ErrAuthExpired), errors.Is(err, nats.ErrAuthRevoked):
		return " (the server refused the credentials: check --nats-creds, --nats-nkey or the user:password in --nats-url)"
	case errors.As(err, &unknownCA), errors.As(err, &badHost):
		return " (the server's certificate is not trusted: --nats-tls-ca names the CA that issued it)"
	case errors.Is(err, nats.ErrSecureConnWanted):
		return " (the server offers no TLS: use a nats:// URL without --nats-tls-ca, --nats-tls-cert and --nats-tls-key)"
	case errors.Is(err, nats.ErrSecureConnRequired):
		return " (the server requires TLS: use a tls:// URL or --nats-tls-ca)"
	}
	return ""
}

// loadCAPool reads a PEM bundle of CA certificates.
func loadCAPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, errors.New("no PEM certificate in it")
	}
	return pool, nil
}
