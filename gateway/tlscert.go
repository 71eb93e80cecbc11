package gateway

import (
	"crypto/tls"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// DefaultCertCheckInterval is how often, at most, CertFiles looks at its
// files: one stat of each per interval, on a handshake, costs nothing next
// to the handshake.
const DefaultCertCheckInterval = 2 * time.Second

// CertFiles serves the listener's certificate from a PEM certificate
// (chain) file and key file, and loads them again when either changes
// (size or modification time), so a renewed certificate (certbot,
// cert-manager) is served to new connections without a restart. It checks
// on a handshake, at most every check interval: no goroutine. A pair that
// does not load (a renewal half written, a key that does not match) is
// logged and counted (fanwire_file_reloads_total{file="tls_certificate",
// result="failed"}), the previous certificate kept, and it is tried again
// at every check until it loads (reload.go says why). Connections already
// open keep the certificate they shook hands with. Safe for concurrent use.
type CertFiles struct {
	certFile, keyFile string        // static
	every             time.Duration // static
	log               *zap.Logger   // static
	counts            reloadCounts

	mu      sync.Mutex
	cert    *tls.Certificate // guarded by mu: served
	loaded  []fileStamp      // guarded by mu: the files as they were when cert was loaded
	failed  string           // guarded by mu: the last failure logged ("": the files load)
	checked time.Time        // guarded by mu: last look at the files
}

// NewCertFiles loads the certificate and key; a missing, unreadable or
// mismatched pair is an error naming the files. every ≤ 0 means
// DefaultCertCheckInterval.
func NewCertFiles(certFile, keyFile string, every time.Duration, log *zap.Logger) (*CertFiles, error) {
	if every <= 0 {
		every = DefaultCertCheckInterval
	}
	if log == nil {
		log = zap.NewNop()
	}
	c := &CertFiles{certFile: certFile, keyFile: keyFile, every: every, log: log}
	stamps, err := c.stamps()
	if err == nil {
		c.cert, err = c.load()
	}
	if err != nil {
		return nil, err
	}
	c.loaded, c.checked = stamps, time.Now()
	return c, nil
}

// Collector exports the reloads' outcomes,
// fanwire_file_reloads_total{file="tls_certificate",result}: register it
// on the role's registry.
func (c *CertFiles) Collector() prometheus.Collector {
	return newReloadCollector("tls_certificate", &c.counts)
}

// TLSConfig is the listener's configuration: TLS 1.2 or later, the
// certificate from GetCertificate, and HTTP/1.1 only, since a WebSocket
// upgrades an HTTP/1.1 request (browsers fall back to it for wss:// when
// the server offers no WebSockets over HTTP/2).
func (c *CertFiles) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: c.GetCertificate,
		NextProtos:     []string{"http/1.1"},
	}
}

// GetCertificate is tls.Config.GetCertificate: the current certificate,
// loaded again first if the files changed since the last check.
func (c *CertFiles) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.Sub(c.checked) >= c.every {
		c.checked = now
		c.reloadLocked()
	}
	return c.cert, nil
}

// reloadLocked loads the files if they differ from the pair last loaded;
// a failure keeps the served certificate, and is logged once per distinct
// failure (it is tried again at every check).
func (c *CertFiles) reloadLocked() {
	stamps, err := c.stamps()
	if err == nil && sameStamps(stamps, c.loaded) {
		c.failed = ""
		return
	}
	var cert *tls.Certificate
	if err == nil {
		cert, err = c.load()
	}
	if err != nil {
		c.counts.failed.Add(1)
		if msg := errString(err); msg != c.failed {
			c.failed = msg
			c.log.Warn("tls certificate files changed but do not load: serving the previous certificate, trying again at every check", zap.Error(err))
		}
		return
	}
	c.cert, c.loaded, c.failed = cert, stamps, ""
	c.counts.ok.Add(1)
	fields := []zap.Field{zap.String("cert", c.certFile)}
	if cert.Leaf != nil { // LoadX509KeyPair parses it since Go 1.23
		fields = append(fields, zap.String("subject", cert.Leaf.Subject.String()), zap.Time("not_after", cert.Leaf.NotAfter))
	}
	c.log.Info("tls certificate reloaded", fields...)
}

func (c *CertFiles) stamps() ([]fileStamp, error) {
	s, err := statFiles(c.certFile, c.keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	return s, nil
}

func (c *CertFiles) load() (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: certificate %s, key %s: %w", c.certFile, c.keyFile, err)
	}
	return &cert, nil
}
