package broker

import (
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// EmbeddedConfig configures an in-process NATS server.
type EmbeddedConfig struct {
	Host      string // default 127.0.0.1
	Port      int    // 0 picks a free port
	StoreDir  string // JetStream store; required when JetStream is on
	JetStream bool
}

// StartEmbedded starts a NATS server in this process and waits until it
// accepts connections. Stop it with Shutdown and WaitForShutdown.
func StartEmbedded(cfg EmbeddedConfig) (*server.Server, error) {
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	port := cfg.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	if cfg.JetStream && cfg.StoreDir == "" {
		return nil, fmt.Errorf("embedded nats: JetStream needs a store directory")
	}
	ns, err := server.NewServer(&server.Options{
		ServerName: "fanwire-embedded",
		Host:       cfg.Host,
		Port:       port,
		JetStream:  cfg.JetStream,
		StoreDir:   cfg.StoreDir,
		NoSigs:     true,
		// The ws role is one client taking every event; give its pending
		// buffer room for bursts (the server default is 64 MiB).
		MaxPending: 256 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, fmt.Errorf("embedded nats: not ready for connections after 10s (port %d taken?)", cfg.Port)
	}
	return ns, nil
}
