package broker

import (
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// EmbeddedConfig configures an in-process NATS server.
type EmbeddedConfig struct {
	Host       string // default 127.0.0.1
	Port       int    // 0 picks a free port
	StoreDir   string // JetStream store; required when JetStream is on
	JetStream  bool
	ServerName string           // default "fanwire-embedded"; every server of a cluster needs its own
	Cluster    *EmbeddedCluster // nil: a standalone server
}

// EmbeddedCluster makes an embedded server one node of a NATS cluster
// (JetStream then runs clustered: replicated streams, elected leaders).
type EmbeddedCluster struct {
	Name   string   // the cluster's name, the same on every node
	Port   int      // this node's route listener on Host; it must be fixed, since the others' Routes name it
	Routes []string // every node's route URL (nats-route://host:port), this one's included: a node ignores a route to itself
}

// StartEmbedded starts a NATS server in this process and waits until it
// accepts connections. Stop it with Shutdown and WaitForShutdown.
func StartEmbedded(cfg EmbeddedConfig) (*server.Server, error) {
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.ServerName == "" {
		cfg.ServerName = "fanwire-embedded"
	}
	port := cfg.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	if cfg.JetStream && cfg.StoreDir == "" {
		return nil, fmt.Errorf("embedded nats: JetStream needs a store directory")
	}
	opts := &server.Options{
		ServerName: cfg.ServerName,
		Host:       cfg.Host,
		Port:       port,
		JetStream:  cfg.JetStream,
		StoreDir:   cfg.StoreDir,
		NoSigs:     true,
		// The ws role is one client taking every event; give its pending
		// buffer room for bursts (the server default is 64 MiB).
		MaxPending: 256 << 20,
	}
	if c := cfg.Cluster; c != nil {
		if c.Name == "" || c.Port == 0 {
			return nil, fmt.Errorf("embedded nats: a cluster node needs Cluster.Name and a fixed Cluster.Port")
		}
		opts.Cluster = server.ClusterOpts{Name: c.Name, Host: cfg.Host, Port: c.Port}
		for _, r := range c.Routes {
			u, err := url.Parse(r)
			if err != nil || u.Host == "" {
				return nil, fmt.Errorf("embedded nats: cluster route %q is not a nats-route://host:port URL", r)
			}
			opts.Routes = append(opts.Routes, u)
		}
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	errs := &embeddedErrors{}
	ns.SetLoggerV2(errs, false, false, false)
	ns.Start()
	// Ready once every listener is up; a listener that could not bind is
	// a fatal error, reported at once.
	deadline := time.Now().Add(10 * time.Second)
	for !ns.ReadyForConnections(50 * time.Millisecond) {
		fatal, last := errs.get()
		if fatal == "" && time.Now().Before(deadline) {
			continue
		}
		ns.Shutdown()
		switch {
		case fatal != "":
			return nil, fmt.Errorf("embedded nats: %s", fatal)
		case last != "":
			return nil, fmt.Errorf("embedded nats: not ready for connections after 10s: %s", last)
		}
		return nil, fmt.Errorf("embedded nats: not ready for connections after 10s")
	}
	return ns, nil
}

// embeddedErrors is the embedded server's logger: it keeps the first
// fatal error (a listener that could not bind, say) and the last error
// for StartEmbedded to report, and drops the rest. (nats-server's own
// logger would exit the process on a fatal error.)
type embeddedErrors struct {
	mu          sync.Mutex
	fatal, last string
}

func (l *embeddedErrors) get() (fatal, last string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatal, l.last
}

func (l *embeddedErrors) Fatalf(format string, v ...any) {
	l.mu.Lock()
	if l.fatal == "" {
		l.fatal = fmt.Sprintf(format, v...)
	}
	l.mu.Unlock()
}

func (l *embeddedErrors) Errorf(format string, v ...any) {
	l.mu.Lock()
	l.last = fmt.Sprintf(format, v...)
	l.mu.Unlock()
}

func (*embeddedErrors) Noticef(string, ...any) {}
func (*embeddedErrors) Warnf(string, ...any)   {}
func (*embeddedErrors) Debugf(string, ...any)  {}
func (*embeddedErrors) Tracef(string, ...any)  {}
