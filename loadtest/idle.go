package loadtest

import (
	"context"
	"fmt"
	"io"
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
	// (from its /metrics; 0 when it could not be read), and the heap
	// live at its last GC, estimated from the next GC's goal (see
	// gauges.liveHeap): the least noisy of the three, as it counts
	// neither memory the runtime has not returned to the system (RSS)
	// nor garbage made since the last GC (heap in use).
	HeapIdleBytes     int64 `json:",omitempty"`
	HeapHeldBytes     int64 `json:",omitempty"`
	LiveHeapIdleBytes int64 `json:",omitempty"`
	LiveHeapHeldBytes int64 `json:",omitempty"`
}

// Idle connects cfg.Clients clients (subscribed, as in Run), waits settle so
// that connection set-up garbage is collected and idle writers exit, and
// reads the gateway's current RSS. In a view run (cfg.Where) it then
// publishes each client's documents once, waits until every client has
// exactly its own, waits settle again and reads the RSS a second time.
// The clients are read throughout, so that they answer the gateway's
// pings as real idle clients do, and verified as in Run: a client that
// gets anything it should not, or loses its connection, fails the
// measurement. cfg.Proc must name the gateway.
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
	connectTime := time.Since(start)
	s := startSession(ctx, &cfg, clients)
	res, err := idle(ctx, &cfg, s, mr, settle)
	if cerr := s.close(cfg.viewRun()); err == nil && cerr != nil {
		err = fmt.Errorf("loadtest: %w", cerr)
	}
	if err != nil {
		return nil, err
	}
	res.BaselineBytes, res.ConnectTime = base, connectTime
	if cfg.Clients > 0 {
		res.PerConnBytes = (res.IdleBytes - res.BaselineBytes) / int64(cfg.Clients)
	}
	return res, nil
}

// idle takes Idle's readings while s holds the clients.
func idle(ctx context.Context, cfg *Config, s *session, mr *metricsReader, settle time.Duration) (*IdleResult, error) {
	res := &IdleResult{Clients: cfg.Clients, Where: cfg.Where}
	var err error
	if res.IdleBytes, res.HeapIdleBytes, res.LiveHeapIdleBytes, err = settleAndRead(ctx, cfg, mr, settle); err != nil {
		return nil, err
	}
	if !cfg.viewRun() {
		return res, nil
	}
	if err := s.deliver(ctx); err != nil {
		return nil, fmt.Errorf("loadtest: documents: %w", err)
	}
	res.HeldDocs = cfg.Events
	if res.HeldBytes, res.HeapHeldBytes, res.LiveHeapHeldBytes, err = settleAndRead(ctx, cfg, mr, settle); err != nil {
		return nil, err
	}
	res.PerDocBytes = (res.HeldBytes - res.IdleBytes) / int64(res.HeldDocs)
	return res, nil
}

// settleAndRead waits settle, then reads the gateway's RSS and, when mr
// is set and answers, its heap in use and live heap (0 otherwise).
func settleAndRead(ctx context.Context, cfg *Config, mr *metricsReader, settle time.Duration) (rss, heap, live int64, err error) {
	select {
	case <-time.After(settle):
	case <-ctx.Done():
		return 0, 0, 0, ctx.Err()
	}
	if rss, err = cfg.Proc.RSS(); err != nil {
		return 0, 0, 0, fmt.Errorf("loadtest: %w", err)
	}
	if mr != nil {
		if g, err := mr.read(ctx); err == nil {
			heap, live = g.heapInuse, g.liveHeap()
		}
	}
	return rss, heap, live, nil
}

// WriteTable prints the result for people.
func (r *IdleResult) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "idle connections            %d (connected in %v)\n", r.Clients, r.ConnectTime.Round(time.Millisecond))
	fmt.Fprintf(w, "gateway rss before          %.1f MiB\n", float64(r.BaselineBytes)/(1<<20))
	fmt.Fprintf(w, "gateway rss idle            %.1f MiB%s\n", float64(r.IdleBytes)/(1<<20), heapNote(r.HeapIdleBytes, r.LiveHeapIdleBytes))
	fmt.Fprintf(w, "per connection              %.1f KiB\n", float64(r.PerConnBytes)/1024)
	if r.HeldDocs > 0 {
		fmt.Fprintf(w, "views                       where %s, %d documents held in all\n", r.Where, r.HeldDocs)
		fmt.Fprintf(w, "gateway rss holding them    %.1f MiB%s\n", float64(r.HeldBytes)/(1<<20), heapNote(r.HeapHeldBytes, r.LiveHeapHeldBytes))
		fmt.Fprintf(w, "per document                %d B (rss)", r.PerDocBytes)
		if r.HeapIdleBytes > 0 && r.HeapHeldBytes > 0 {
			fmt.Fprintf(w, ", %d B (heap in use)", (r.HeapHeldBytes-r.HeapIdleBytes)/int64(r.HeldDocs))
		}
		if r.LiveHeapIdleBytes > 0 && r.LiveHeapHeldBytes > 0 {
			fmt.Fprintf(w, ", %d B (live heap)", (r.LiveHeapHeldBytes-r.LiveHeapIdleBytes)/int64(r.HeldDocs))
		}
		fmt.Fprintln(w)
	}
}

func heapNote(heap, live int64) string {
	if heap <= 0 {
		return ""
	}
	return fmt.Sprintf(" (heap in use %.1f MiB, live at the last GC %.1f MiB)", float64(heap)/(1<<20), float64(live)/(1<<20))
}
