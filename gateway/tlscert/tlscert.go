package tlscert

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"sync"
	"time"

	"github.com/fanwire/fanwire/gateway/internal/reload"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// DefaultCheckInterval is how often, at most, Files looks at its
// files: one stat of each per interval, on a handshake, costs nothing next
// to the handshake.
const DefaultCheckInterval = 2 * time.Second

// Files serves the listener's certificate from a PEM certificate
// (chain) file and key file, and loads them again when either changes
// (size or modification time), so a renewed certificate (certbot,
// cert-manager) is served to new connections without a restart. It checks
// on a handshake, at most every check interval: no goroutine. A pair that
// does not load (a renewal half written, a key that does not match) is
// logged and counted (fanwire_file_reloads_total{file="tls_certificate",
// result="failed"}), the previous certificate kept, and it is tried again
// at every check until it loads (package gateway/internal/reload says why). Connections already
// open keep the certificate they shook hands with. The served
// certificate's expiry is exported for alerting
// (fanwire_tls_certificate_expiry_timestamp_seconds). Safe for concurrent use.
type Files struct {
	certFile, keyFile string        // static
	every             time.Duration // static
	log               *zap.Logger   // static
	counts            reload.Counts

	mu      sync.Mutex
	cert    *tls.Certificate // guarded by mu: served
	expiry  time.Time        // guarded by mu: cert's leaf's notAfter
	loaded  []reload.Stamp   // guarded by mu: the files as they were when cert was loaded
	failed  string           // guarded by mu: the last failure logged ("": the files load)
	checked time.Time        // guarded by mu: last look at the files
}

// New loads the certificate and key; a missing, unreadable or
// mismatched pair is an error naming the files. every ≤ 0 means
// DefaultCheckInterval.
func New(certFile, keyFile string, every time.Duration, log *zap.Logger) (*Files, error) {
	if every <= 0 {
		every = DefaultCheckInterval
	}
	if log == nil {
		log = zap.NewNop()
	}
	c := &Files{certFile: certFile, keyFile: keyFile, every: every, log: log}
	stamps, err := c.stamps()
	if err == nil {
		c.cert, c.expiry, err = c.load()
	}
	if err != nil {
		return nil, err
	}
	c.loaded, c.checked = stamps, time.Now()
	return c, nil
}

// Collector exports the reloads' outcomes,
// fanwire_file_reloads_total{file="tls_certificate",result}, and the served
// certificate's expiry, fanwire_tls_certificate_expiry_timestamp_seconds:
// register it on the role's registry.
func (c *Files) Collector() prometheus.Collector {
	return &collector{c: c, reloads: reload.NewCollector("tls_certificate", &c.counts)}
}

var descExpiry = prometheus.NewDesc("fanwire_tls_certificate_expiry_timestamp_seconds",
	"When the certificate served on --listen expires: its notAfter, in Unix seconds. "+
		"A scrape checks the files first, as a handshake does, so a renewal shows before a client connects.", nil, nil)

// collector exports a Files' reloads and its certificate's expiry.
type collector struct {
	c       *Files               // static
	reloads prometheus.Collector // static
}

func (cc *collector) Describe(ch chan<- *prometheus.Desc) {
	cc.reloads.Describe(ch)
	ch <- descExpiry
}

// Collect runs the periodic check first: without it, a node that no
// client connected to since its certificate was renewed on disk would
// report the old expiry, and page, though its next handshake serves the
// new one.
func (cc *collector) Collect(ch chan<- prometheus.Metric) {
	cc.c.mu.Lock()
	cc.c.checkLocked()
	expiry := cc.c.expiry
	cc.c.mu.Unlock()
	cc.reloads.Collect(ch)
	ch <- prometheus.MustNewConstMetric(descExpiry, prometheus.GaugeValue, float64(expiry.Unix()))
}

// TLSConfig is the listener's configuration: TLS 1.2 or later, the
// certificate from GetCertificate, and HTTP/1.1 only, since a WebSocket
// upgrades an HTTP/1.1 request (browsers fall back to it for wss:// when
// the server offers no WebSockets over HTTP/2).
func (c *Files) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: c.GetCertificate,
		NextProtos:     []string{"http/1.1"},
	}
}

// GetCertificate is tls.Config.GetCertificate: the current certificate,
// loaded again first if the files changed since the last check.
func (c *Files) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checkLocked()
	return c.cert, nil
}

// Reload looks at the files now, as a handshake after the check interval
// does, and loads them if they changed.
func (c *Files) Reload() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reloadLocked()
}

// checkLocked looks at the files if the check interval has passed since
// the last look.
func (c *Files) checkLocked() {
	if now := time.Now(); now.Sub(c.checked) >= c.every {
		c.checked = now
		c.reloadLocked()
	}
}

// reloadLocked loads the files if they differ from the pair last loaded;
// a failure keeps the served certificate, and is logged once per distinct
// failure (it is tried again at every check).
func (c *Files) reloadLocked() {
	stamps, err := c.stamps()
	if err == nil && reload.Same(stamps, c.loaded) {
		c.failed = ""
		return
	}
	var cert *tls.Certificate
	var expiry time.Time
	if err == nil {
		cert, expiry, err = c.load()
	}
	if err != nil {
		c.counts.Failed.Add(1)
		if msg := reload.ErrString(err); msg != c.failed {
			c.failed = msg
			c.log.Warn("tls certificate files changed but do not load: serving the previous certificate, trying again at every check", zap.Error(err))
		}
		return
	}
	c.cert, c.expiry, c.loaded, c.failed = cert, expiry, stamps, ""
	c.counts.OK.Add(1)
	c.log.Info("tls certificate reloaded", zap.String("cert", c.certFile), zap.String("subject", cert.Leaf.Subject.String()), zap.Time("not_after", expiry))
}

func (c *Files) stamps() ([]reload.Stamp, error) {
	s, err := reload.Stat(c.certFile, c.keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	return s, nil
}

// load reads the pair and returns it with its leaf's notAfter.
func (c *Files) load() (*tls.Certificate, time.Time, error) {
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err == nil && cert.Leaf == nil { // LoadX509KeyPair parses it since Go 1.23, unless GODEBUG x509keypairleaf=0
		cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0])
	}
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("tls: certificate %s, key %s: %w", c.certFile, c.keyFile, err)
	}
	return &cert, cert.Leaf.NotAfter, nil
}
