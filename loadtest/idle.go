package loadtest

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"
)

// IdleResult is what Idle measured: the gateway's resident memory with
// Clients subscribed connections that receive nothing, and, in a view run
// (Config.Where), again once each view holds its documents.
type IdleResult struct {
	Clients       int
	BaselineBytes int64 // gateway VmRSS before the clients connected
	IdleBytes     int64 // gateway VmRSS with every client connected, after Settle
	PerConnBytes  int64 // (IdleBytes - BaselineBytes) / Clients
	ConnectTime   time.Duration

	// A view run's second reading: every client's documents were
	// published once (Clients × WhereDocs events, each to its one
	// client), then the run waited Settle again. A filtered view holds
	// the subjects it was sent; a subject-routed one (WhereSubject) holds
	// nothing, so its figure is what the events themselves leave behind.
	Where       string `json:",omitempty"`
	HeldDocs    int    `json:",omitempty"` // Clients × WhereDocs
	HeldBytes   int64  `json:",omitempty"` // gateway VmRSS after the documents and Settle
	PerDocBytes int64  `json:",omitempty"` // (HeldBytes - IdleBytes) / HeldDocs
	// The gateway's go_memstats_heap_inuse_bytes at the two readings
	// (from its /metrics; 0 when it could not be read): less noisy than
	// RSS, which also counts memory the runtime has not yet returned.
	HeapIdleBytes int64 `json:",omitempty"`
	HeapHeldBytes int64 `json:",omitempty"`
}

// Idle connects cfg.Clients clients (subscribed, as in Run), waits settle so
// that connection set-up garbage is collected and idle writers exit, reads
// the gateway's current RSS and disconnects. In a view run (cfg.Where) it
// then publishes each client's documents once, waits until every client
// has exactly its own (verified as in Run), waits settle again and reads
// the RSS a second time. cfg.Proc must name the gateway.
func Idle(ctx context.Context, cfg Config, settle time.Duration) (*IdleResult, error) {
	if cfg.Where != "" {
		docs := max(cfg.WhereDocs, DefaultWhereDocs)
		cfg.Events = cfg.Clients * docs // each document once
	}
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
	var mr *metricsReader
	if u, err := metricsURL(cfg.URL); err == nil {
		mr = newMetricsReader(u, cfg.Timeout)
	}
	start := time.Now()
	clients, err := connectAll(ctx, &cfg)
	if err != nil {
		return nil, fmt.Errorf("loadtest: connect clients: %w", err)
	}
	defer closeAll(ctx, clients)
	res := &IdleResult{Clients: cfg.Clients, BaselineBytes: base, ConnectTime: time.Since(start), Where: cfg.Where}
	if res.IdleBytes, res.HeapIdleBytes, err = settleAndRead(ctx, &cfg, mr, settle); err != nil {
		return nil, err
	}
	if cfg.Clients > 0 {
		res.PerConnBytes = (res.IdleBytes - res.BaselineBytes) / int64(cfg.Clients)
	}
	if !cfg.viewRun() {
		return res, nil
	}
	if err := fill(ctx, &cfg, clients); err != nil {
		return nil, fmt.Errorf("loadtest: documents: %w", err)
	}
	res.HeldDocs = cfg.Events
	if res.HeldBytes, res.HeapHeldBytes, err = settleAndRead(ctx, &cfg, mr, settle); err != nil {
		return nil, err
	}
	res.PerDocBytes = (res.HeldBytes - res.IdleBytes) / int64(res.HeldDocs)
	return res, nil
}

// settleAndRead waits settle, then reads the gateway's RSS and, when mr
// is set and answers, its heap in use (0 otherwise).
func settleAndRead(ctx context.Context, cfg *Config, mr *metricsReader, settle time.Duration) (rss, heap int64, err error) {
	select {
	case <-time.After(settle):
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	if rss, err = cfg.Proc.RSS(); err != nil {
		return 0, 0, fmt.Errorf("loadtest: %w", err)
	}
	if mr != nil {
		if g, err := mr.read(ctx); err == nil {
			heap = g.heapInuse
		}
	}
	return rss, heap, nil
}

// fill publishes cfg.Events events (a view run's documents) and reads
// every client until it holds all of its own, as Run verifies them. The
// connections stay open; when delivery stalls for cfg.Timeout or ctx ends
// they are closed, which ends the readers.
func fill(ctx context.Context, cfg *Config, clients []*client) error {
	out, err := openSink(ctx, cfg)
	if err != nil {
		return err
	}
	defer out.close()
	var wg sync.WaitGroup
	finished := make(chan struct{}, len(clients)) // each reader sends once
	for _, c := range clients {
		wg.Go(func() {
			defer func() { finished <- struct{}{} }()
			for !c.v.complete() {
				msg, at, err := c.conn.ReadMessage()
				if err != nil {
					c.err = fmt.Errorf("client %d: read: %w", c.id, err)
					return
				}
				c.handleFrame(msg, at)
			}
		})
	}
	pctx, stop := context.WithCancel(ctx)
	defer stop()
	published := make(chan error, 1) // the one send never blocks
	wg.Go(func() { published <- publish(pctx, out, cfg, nil) })
	m := monitor{cfg: cfg, clients: clients, start: time.Now()}
	werr := m.wait(ctx, finished, published)
	if werr != nil || m.timedOut {
		stop()
		for _, c := range clients { // ends the readers still waiting
			_ = c.conn.CloseNow()
		}
	}
	wg.Wait()
	if werr != nil {
		return werr
	}
	if m.published == 0 { // the monitor did not take the publisher's result
		if err := <-published; err != nil && !m.timedOut {
			return fmt.Errorf("publish: %w", err)
		}
	}
	var bad []string
	for _, c := range clients {
		v := &c.v
		if !v.complete() || v.gaps+v.dups+v.late+v.alien+c.malformed+c.leaves+c.serverErrors > 0 || c.err != nil {
			bad = append(bad, fmt.Sprintf("client %d: %d of %d, gaps %d, dups %d, out of order %d, unexpected %d, leaves %d, errors %d %s %v",
				c.id, v.distinct, v.events, v.gaps, v.dups, v.late, v.alien, c.leaves, c.serverErrors, c.firstServerError, c.err))
		}
	}
	if len(bad) > 0 {
		stalled := ""
		if m.timedOut {
			stalled = fmt.Sprintf(" (no delivery for %v)", cfg.Timeout)
		}
		return fmt.Errorf("%d of %d clients did not get exactly their documents%s; first: %s", len(bad), len(clients), stalled, bad[0])
	}
	return nil
}

// WriteTable prints the result for people.
func (r *IdleResult) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "idle connections            %d (connected in %v)\n", r.Clients, r.ConnectTime.Round(time.Millisecond))
	fmt.Fprintf(w, "gateway rss before          %.1f MiB\n", float64(r.BaselineBytes)/(1<<20))
	fmt.Fprintf(w, "gateway rss idle            %.1f MiB%s\n", float64(r.IdleBytes)/(1<<20), heapNote(r.HeapIdleBytes))
	fmt.Fprintf(w, "per connection              %.1f KiB\n", float64(r.PerConnBytes)/1024)
	if r.HeldDocs > 0 {
		fmt.Fprintf(w, "views                       where %s, %d documents held in all\n", r.Where, r.HeldDocs)
		fmt.Fprintf(w, "gateway rss holding them    %.1f MiB%s\n", float64(r.HeldBytes)/(1<<20), heapNote(r.HeapHeldBytes))
		fmt.Fprintf(w, "per document                %d B (rss)", r.PerDocBytes)
		if r.HeapIdleBytes > 0 && r.HeapHeldBytes > 0 {
			fmt.Fprintf(w, ", %d B (heap in use)", (r.HeapHeldBytes-r.HeapIdleBytes)/int64(r.HeldDocs))
		}
		fmt.Fprintln(w)
	}
}

func heapNote(heap int64) string {
	if heap <= 0 {
		return ""
	}
	return fmt.Sprintf(" (heap in use %.1f MiB)", float64(heap)/(1<<20))
}
