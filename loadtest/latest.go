package loadtest

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"
)

// Latest measures reading a stream's documents into one client: docs
// documents, each published once on a subject of its own (customer 0's
// rows in the views layout, views_config.go: <Subject>.0.<row>), are read
// by subscribing to <Subject>.*.* from "latest" (a snapshot: each
// subject's newest event) and, for comparison, from the cursor just
// before them (a replay of the same events). Each read must deliver every
// document once, in order, then "synced"; it is timed from sending the
// subscribe to receiving synced. The two alternate, rounds times each,
// starting with the snapshot; with cfg.Where the snapshot's subscription
// also has customer 0's filter, which every document passes (the replay
// stays unfiltered: a filtered subscription from a cursor is a view's
// resume, itself a snapshot). The gateway's broker must keep history and
// serve "latest" (JetStream or Redis Streams).
func Latest(ctx context.Context, cfg Config, docs, rounds int) (*LatestResult, error) {
	filter := cfg.Where
	if filter != "" && filter != WhereEq && filter != WhereRange {
		return nil, fmt.Errorf("loadtest: %w: Where %q: a snapshot takes eq or range", ErrInvalidConfig, filter)
	}
	// Publish as a view run of one client holding every document.
	cfg.Where, cfg.Clients, cfg.WhereDocs, cfg.Events = WhereEq, 1, docs, docs
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("loadtest: %w", err)
	}
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("loadtest: %w", err)
	}
	if docs < 1 || rounds < 1 {
		return nil, fmt.Errorf("loadtest: %w: want at least 1 document and 1 round, not %d and %d", ErrInvalidConfig, docs, rounds)
	}
	out, err := openSink(ctx, &cfg)
	if err != nil {
		return nil, fmt.Errorf("loadtest: %w", err)
	}
	defer out.close()
	// The primer's cursor is where the replay starts: just before the
	// documents. Its subject is outside <Subject>.*.*.
	before, err := out.sendAcked(ctx, cfg.Subject, []byte(`{"primer":true}`))
	if err != nil {
		return nil, fmt.Errorf("loadtest: publish primer: %w", err)
	}
	// A read's synced comes when it hands over to the node's live feed,
	// so documents the feed has not dispatched yet would come after it:
	// a live client, subscribed (unfiltered) before they are published,
	// must have every one before any read starts.
	live := cfg
	live.Where = WhereSubject // customer 0's rows: <Subject>.0.*, every document
	clients, err := connectAll(ctx, &live)
	if err != nil {
		return nil, fmt.Errorf("loadtest: connect the live client: %w", err)
	}
	s := startSession(ctx, &live, clients)
	err = s.deliver(ctx)
	if cerr := s.close(true); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("loadtest: publish: %w", err)
	}
	res := &LatestResult{Docs: docs, Where: filter, OK: true}
	// The first read after publishing was the slowest (a snapshot, 20-35%
	// below the next ones, on JetStream and on Redis Streams): a warm-up
	// replay, reported but not counted in the medians, takes that cost
	// for neither kind.
	kinds := []string{readWarmUp}
	for r := range rounds {
		if r%2 == 0 {
			kinds = append(kinds, readSnapshot, readReplay)
		} else {
			kinds = append(kinds, readReplay, readSnapshot)
		}
	}
	for _, kind := range kinds {
		sub := subscription{subject: cfg.Subject + ".*.*", from: before}
		if kind == readSnapshot {
			sub.from = "latest"
			if filter != "" {
				c := cfg
				c.Where = filter
				sub.where = c.clientSub(0).where
			}
		}
		rd, err := readAll(ctx, &cfg, sub, docs)
		if err != nil {
			return nil, fmt.Errorf("loadtest: %s: %w", kind, err)
		}
		rd.Kind = kind
		res.Reads = append(res.Reads, *rd)
		res.OK = res.OK && rd.OK
	}
	res.summarize()
	return res, nil
}

// The ways Latest reads the documents.
const (
	readSnapshot = "snapshot" // from "latest"
	readReplay   = "replay"   // from the cursor before them
	readWarmUp   = "warm-up"  // a replay before the measured reads, not counted
)

// LatestResult is what Latest measured.
type LatestResult struct {
	Docs  int
	Where string // the snapshot's filter (Config.Where), "" for none
	Reads []LatestRead
	// Medians over the reads of each kind.
	SnapshotDocsPerSec, ReplayDocsPerSec           float64
	SnapshotCPUMicrosPerDoc, ReplayCPUMicrosPerDoc float64 // the gateway's; 0 when not sampled
	OK                                             bool    // every read: every document once, in order, then synced, nothing else
}

// LatestRead is one read of the documents.
type LatestRead struct {
	Kind              string        // "snapshot", "replay" or "warm-up" (a replay not counted in the medians)
	Time              time.Duration // subscribe sent → synced received
	DocsPerSec        float64
	GatewayCPUSeconds float64 // over Time; 0 when not sampled
	Received          int64
	Gaps, Duplicates  int64
	OutOfOrder        int64
	Missing           int64
	Unexpected        int64 // events outside 1..Docs, leaves, malformed messages
	OK                bool
}

// readAll subscribes one new client with sub and reads until "synced".
func readAll(ctx context.Context, cfg *Config, sub subscription, docs int) (*LatestRead, error) {
	dctx, cancel := context.WithTimeout(ctx, cfg.Timeout+time.Duration(docs)*time.Millisecond)
	defer cancel()
	nc, err := dialWS(dctx, cfg)
	if err != nil {
		return nil, err
	}
	defer nc.CloseNow()
	if _, err := await(dctx, nc, func(m *controlMsg) bool { return m.Type == "ready" }); err != nil {
		return nil, fmt.Errorf("await ready: %w", err)
	}
	conn := &nativeConn{Conn: nc}
	unwatch := context.AfterFunc(dctx, func() { _ = conn.CloseNow() }) // reads take no context
	defer unwatch()
	cpu0, err := gatewayCPU(cfg)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	if err := writeSubscribe(dctx, nc, sub); err != nil {
		return nil, fmt.Errorf("subscribe: %w", err)
	}
	v := newVerifier(docs)
	var unexpected int64
	for synced := false; !synced; {
		frame, _, err := conn.ReadMessage()
		if err != nil {
			if dctx.Err() != nil {
				err = fmt.Errorf("%w (%v)", dctx.Err(), err)
			}
			return nil, fmt.Errorf("after %d of %d documents, no synced: %w", v.delivered, docs, err)
		}
		for len(frame) > 0 {
			var msg []byte
			var kind msgKind
			var seq uint64
			msg, frame, kind, seq, _ = splitFrame(frame, false)
			switch kind {
			case kindEvent:
				v.observe(seq)
			case kindSynced:
				synced = true
			case kindError:
				return nil, fmt.Errorf("%w: %s", ErrRejected, msg)
			case kindLeave, kindMalformed:
				unexpected++
			}
		}
	}
	rd := &LatestRead{Time: time.Since(start), Received: v.delivered, Gaps: v.gaps, Duplicates: v.dups,
		OutOfOrder: v.late, Missing: v.missing(), Unexpected: v.alien + unexpected}
	cpu1, err := gatewayCPU(cfg)
	if err != nil {
		return nil, err
	}
	rd.GatewayCPUSeconds = cpu1 - cpu0
	rd.DocsPerSec = float64(docs) / rd.Time.Seconds()
	rd.OK = rd.Gaps+rd.Duplicates+rd.OutOfOrder+rd.Missing+rd.Unexpected == 0 && rd.Received == int64(docs)
	if unwatch() {
		conn.CloseNormal(dctx)
	}
	return rd, nil
}

// gatewayCPU reads the gateway's CPU seconds, 0 when it is not sampled.
func gatewayCPU(cfg *Config) (float64, error) {
	if !cfg.Proc.Enabled() {
		return 0, nil
	}
	return cfg.Proc.CPUSeconds()
}

// summarize sets the medians.
func (r *LatestResult) summarize() {
	med := func(kind string, f func(LatestRead) float64) float64 {
		var xs []float64
		for _, rd := range r.Reads {
			if rd.Kind == kind {
				xs = append(xs, f(rd))
			}
		}
		return median(xs)
	}
	perSec := func(rd LatestRead) float64 { return rd.DocsPerSec }
	cpu := func(rd LatestRead) float64 { return rd.GatewayCPUSeconds * 1e6 / float64(r.Docs) }
	r.SnapshotDocsPerSec, r.ReplayDocsPerSec = med(readSnapshot, perSec), med(readReplay, perSec)
	r.SnapshotCPUMicrosPerDoc, r.ReplayCPUMicrosPerDoc = med(readSnapshot, cpu), med(readReplay, cpu)
}

// median of xs (the mean of the middle two for an even count); 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// WriteTable prints the result for people.
func (r *LatestResult) WriteTable(w io.Writer) {
	filter := "unfiltered"
	if r.Where != "" {
		filter = "where " + r.Where + " (every document passes)"
	}
	fmt.Fprintf(w, "documents                   %d, one subject each; snapshot %s, replay unfiltered\n", r.Docs, filter)
	for _, rd := range r.Reads {
		fmt.Fprintf(w, "%-9s                   %v to synced, %.0f documents/s, gateway cpu %.2f s", rd.Kind, rd.Time.Round(time.Millisecond), rd.DocsPerSec, rd.GatewayCPUSeconds)
		if !rd.OK {
			fmt.Fprintf(w, ", FAIL: received %d, gaps %d, dups %d, out of order %d, missing %d, unexpected %d",
				rd.Received, rd.Gaps, rd.Duplicates, rd.OutOfOrder, rd.Missing, rd.Unexpected)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "median                      snapshot %.0f documents/s (%.2f µs cpu each), replay %.0f/s (%.2f µs)\n",
		r.SnapshotDocsPerSec, r.SnapshotCPUMicrosPerDoc, r.ReplayDocsPerSec, r.ReplayCPUMicrosPerDoc)
	verdict := "OK"
	if !r.OK {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "result                      %s\n", verdict)
}
