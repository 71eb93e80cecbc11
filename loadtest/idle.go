package loadtest

import (
	"context"
	"fmt"
	"io"
	"time"
)

// IdleResult is what Idle measured: the gateway's resident memory with
// Clients subscribed connections that receive nothing.
type IdleResult struct {
	Clients       int
	BaselineBytes int64 // gateway VmRSS before the clients connected
	IdleBytes     int64 // gateway VmRSS with every client connected, after Settle
	PerConnBytes  int64 // (IdleBytes - BaselineBytes) / Clients
	ConnectTime   time.Duration
}

// Idle connects cfg.Clients clients (subscribed, as in Run), waits settle so
// that connection set-up garbage is collected and idle writers exit, reads
// the gateway's current RSS and disconnects. cfg.Proc must name the gateway.
func Idle(ctx context.Context, cfg Config, settle time.Duration) (*IdleResult, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("loadtest: %w", err)
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("loadtest: %w", err)
	}
	if !cfg.Proc.Enabled() {
		return nil, fmt.Errorf("%w: idle measurement needs the gateway's pid", ErrInvalidConfig)
	}
	base, err := cfg.Proc.RSS()
	if err != nil {
		return nil, fmt.Errorf("loadtest: %w", err)
	}
	start := time.Now()
	clients, err := connectAll(ctx, &cfg)
	if err != nil {
		return nil, fmt.Errorf("loadtest: connect clients: %w", err)
	}
	defer closeAll(ctx, clients)
	res := &IdleResult{Clients: cfg.Clients, BaselineBytes: base, ConnectTime: time.Since(start)}
	select {
	case <-time.After(settle):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if res.IdleBytes, err = cfg.Proc.RSS(); err != nil {
		return nil, fmt.Errorf("loadtest: %w", err)
	}
	if cfg.Clients > 0 {
		res.PerConnBytes = (res.IdleBytes - res.BaselineBytes) / int64(cfg.Clients)
	}
	return res, nil
}

// WriteTable prints the result for people.
func (r *IdleResult) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "idle connections            %d (connected in %v)\n", r.Clients, r.ConnectTime.Round(time.Millisecond))
	fmt.Fprintf(w, "gateway rss before          %.1f MiB\n", float64(r.BaselineBytes)/(1<<20))
	fmt.Fprintf(w, "gateway rss idle            %.1f MiB\n", float64(r.IdleBytes)/(1<<20))
	fmt.Fprintf(w, "per connection              %.1f KiB\n", float64(r.PerConnBytes)/1024)
}
