package loadtest

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"
)

// Run connects cfg.Clients clients to the gateway, subscribes them to
// cfg.Subject, publishes cfg.Events events into NATS and waits until every
// client has every event, delivery makes no progress for cfg.Timeout, or ctx
// ends. It returns after every goroutine it started has exited.
//
// A run that loses, duplicates or reorders events, or times out, is a result,
// not an error: Run returns it with a nil error and Result.OK reports false.
// Run returns an error when it could not carry out the test: an invalid
// Config, a client that failed to connect or subscribe, a NATS or publish
// failure, a gateway process that cannot be sampled, a gateway that cannot
// resume subscriptions when cfg.ResumeShare asks for it, or ctx ending.
// A resuming client that fails to reconnect is a result: a disconnect.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("loadtest: %w", err)
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("loadtest: %w", err)
	}
	if cfg.Proc.Enabled() { // fail before connecting anything if the pid is wrong
		if _, err := cfg.Proc.Sample(); err != nil {
			return nil, fmt.Errorf("loadtest: sample gateway: %w", err)
		}
	}
	out, err := openSink(ctx, &cfg)
	if err != nil {
		return nil, fmt.Errorf("loadtest: %w", err)
	}
	defer out.close()
	var sk *soak
	if cfg.Churn > 0 { // fail before connecting anything if the gateway's figures cannot be read
		mr := newMetricsReader(cfg.MetricsURL, cfg.Timeout)
		if _, err := mr.read(ctx); err != nil {
			return nil, fmt.Errorf("loadtest: churn: %w", err)
		}
		sk = newSoak(&cfg, mr)
	}
	var primer string // a resume run's primer's cursor
	if cfg.ResumeShare > 0 || cfg.storm() {
		if primer, err = checkDurable(ctx, &cfg, out); err != nil {
			return nil, fmt.Errorf("loadtest: %w", err)
		}
	}
	clients, err := connectAll(ctx, &cfg)
	if err != nil {
		return nil, fmt.Errorf("loadtest: connect clients: %w", err)
	}
	for _, c := range clients {
		if c.subCursor == "" {
			// A GraphQL subscription has no "subscribed" reply to carry a
			// cursor. It went live after the gateway's feed had passed the
			// primer and before anything else was published, so a drop
			// before its first event resumes from the primer.
			c.subCursor = primer
		}
	}
	res, err := execute(ctx, &cfg, out, clients, sk)
	if err != nil {
		return nil, fmt.Errorf("loadtest: %w", err)
	}
	return res, nil
}

// usage is a pair of process samples: the gateway's and our own.
type usage struct {
	gateway, self ProcSample
}

func sampleUsage(cfg *Config) (usage, error) {
	var u usage
	var err error
	if cfg.Proc.Enabled() {
		if u.gateway, err = cfg.Proc.Sample(); err != nil {
			return u, fmt.Errorf("sample gateway: %w", err)
		}
	}
	if u.self, err = (ProcSampler{PID: os.Getpid()}).Sample(); err != nil {
		return u, fmt.Errorf("sample self: %w", err)
	}
	return u, nil
}

// execute runs the measured part: readers start, the publisher starts (and
// in a churn run the soak, sk), the monitor waits for the end, then
// everything is stopped and waited for.
func execute(ctx context.Context, cfg *Config, out sink, clients []*client, sk *soak) (*Result, error) {
	stopCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait() // runs after stop (defers run last-in first-out)
	defer stop()

	var sent atomic.Int64 // events published so far: where a dropping client has to catch up to
	for i, points := range planDrops(cfg) {
		if points != nil {
			clients[i].rc = &reconnector{cfg: cfg, sent: &sent, points: points, cursor: clients[i].subCursor}
		}
	}
	var st *storm
	if cfg.storm() {
		st = newStorm(cfg, clients, &sent)
	}
	finished := make(chan struct{}, len(clients)) // each reader sends once, so sends never block
	for _, c := range clients {
		wg.Go(func() { c.read(ctx, stopCtx, finished) })
	}
	before, err := sampleUsage(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.CPUProfile != nil {
		if err := pprof.StartCPUProfile(cfg.CPUProfile); err != nil {
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile() // on an early return; a second stop is a no-op
	}
	start := time.Now()
	published := make(chan error, 1)
	if cfg.clientsPublish() {
		wg.Go(func() { published <- publishClients(stopCtx, cfg, clients) })
	} else {
		wg.Go(func() { published <- publish(stopCtx, out, cfg, &sent) })
	}

	churned := make(chan *ChurnStats, 1)
	if sk != nil {
		wg.Go(func() { churned <- sk.run(ctx, stopCtx, start, &sent) })
	}

	stormed := make(chan stormRun, 1)
	sampling, stopSampling := context.WithCancel(stopCtx)
	defer stopSampling()
	if st != nil {
		wg.Go(func() { stormed <- st.run(ctx, sampling, &sent) })
	}

	m := monitor{cfg: cfg, clients: clients, start: start, soak: sk, storm: st}
	if err := m.wait(ctx, finished, published); err != nil {
		return nil, err
	}
	complete := !m.timedOut && m.delivered() >= cfg.expectedTotal()
	if complete && m.published == 0 {
		// The last delivery can beat the publisher's final flush (and
		// its count of the last event), which is about to return.
		select {
		case err := <-published:
			if err == nil {
				m.published = time.Since(start)
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var cs *ChurnStats
	if sk != nil {
		// The soak's schedule ends with the publishing; a run that ended
		// before every client held every event (a stall, clients gone)
		// stops it early. (Not the publisher's count: the last event can
		// reach every client before the publisher has counted it.)
		if !complete {
			stop()
		}
		select {
		case cs = <-churned:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var sr stormRun
	if st != nil {
		// Complete, every client is back and caught up on node B: the
		// storm's window ends by itself. Otherwise it ends here.
		stopSampling()
		select {
		case sr = <-stormed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if sr.err != nil {
			return nil, sr.err
		}
	}
	after, err := sampleUsage(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.CPUProfile != nil {
		pprof.StopCPUProfile()
	}
	stop()
	wg.Wait() // readers have exited: their tallies are ours to read
	res := collect(cfg, clients, &m, before, after)
	res.Churn = cs
	if st != nil {
		res.Storm = collectStorm(sr, clients)
	}
	return res, nil
}
