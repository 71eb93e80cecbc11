package cdc_test

// BenchmarkDeployed: the ingest's headline figures with every part in its
// own OS process, as deployed: PostgreSQL (pgtest), a nats-server built
// from the version in go.mod, `fanwire ingest` and, where a WebSocket
// client is involved, `fanwire ws`. Each op is one whole measured run,
// with a fresh cluster and a fresh JetStream store; the broker's ceiling
// (how fast this machine stores the same events without PostgreSQL and
// without the ingest) is measured in the same op where a ratio needs it.
//
//	go test -run '^$' -bench BenchmarkDeployed -benchtime 1x -timeout 60m ./cdc
//
// Environment:
//
//   - FANWIRE_BENCH_SCALE: a factor on the data set (customers 10k, orders
//     100k, order_items 300k), the tail's writes and the latency run's
//     duration, e.g. 0.05 while developing (default 1).
//   - FANWIRE_BENCH_INGEST_ARGS, FANWIRE_BENCH_WS_ARGS: extra flags for
//     every `fanwire ingest` / `fanwire ws` process (split on spaces), to
//     compare levers.
//   - FANWIRE_BENCH_BIN: the fanwire binary (default: built from this tree).
//   - FANWIRE_BENCH_NATS_BIN: the nats-server binary (default: built from
//     the module version in go.mod, cached under the user's cache dir).

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/cdc"
	"github.com/fanwire/fanwire/cdc/pgjson"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/fanwire/fanwire/jsonstr"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// deployedScale is FANWIRE_BENCH_SCALE (default 1).
func deployedScale(tb testing.TB) float64 {
	s := os.Getenv("FANWIRE_BENCH_SCALE")
	if s == "" {
		return 1
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f <= 0 {
		tb.Fatalf("FANWIRE_BENCH_SCALE=%q: want a positive number", s)
	}
	return f
}

// dataSet is the sizes of the standard data set, scaled.
type dataSet struct{ customers, orders, items int }

func (d dataSet) rows() int { return d.customers + d.orders + d.items }

func scaledDataSet(scale float64) dataSet {
	n := func(v int) int { return max(1, int(float64(v)*scale)) }
	return dataSet{customers: n(10_000), orders: n(100_000), items: n(300_000)}
}

// BenchmarkDeployed: see the top of this file.
func BenchmarkDeployed(b *testing.B) {
	scale := deployedScale(b)
	ds := scaledDataSet(scale)
	bin := benchBinary(b)
	natsBin := natsServerBinary(b)
	b.Run("ceiling", func(b *testing.B) {
		evs := ceilingEvents(ds)
		for range b.N {
			url := natsServerProcess(b, natsBin)
			c := measureCeiling(b, url, evs, "db", "")
			c.report(b)
		}
	})
	for _, kind := range []string{"jetstream", "nats"} {
		b.Run("bootstrap/"+kind, func(b *testing.B) {
			evs := ceilingEvents(ds)
			for range b.N {
				deployedBootstrap(b, bin, natsBin, kind, ds, evs)
			}
		})
	}
	for _, ws := range []bool{false, true} {
		name := "tail-update/broker"
		if ws {
			name = "tail-update/ws"
		}
		b.Run(name, func(b *testing.B) {
			evs := ceilingEvents(ds)
			for range b.N {
				deployedTailUpdate(b, bin, natsBin, ds.orders, evs, ws)
			}
		})
	}
	b.Run("tail-smalltxns", func(b *testing.B) {
		n := max(4, int(40_000*scale))
		for range b.N {
			deployedTailSmallTxns(b, bin, natsBin, n)
		}
	})
	b.Run("latency", func(b *testing.B) {
		seconds := max(1, int(10*scale))
		for range b.N {
			deployedLatency(b, bin, natsBin, 1000, seconds)
		}
	})
	for _, mode := range []string{cdc.ModeMemory, cdc.ModeSQL} {
		b.Run("projection-update/"+mode, func(b *testing.B) {
			for range b.N {
				deployedProjectionUpdate(b, bin, natsBin, mode, ds)
			}
		})
	}
}

// natsServerBinary is FANWIRE_BENCH_NATS_BIN, or nats-server built from
// the version in go.mod (brokertest.NATSServerBinary).
func natsServerBinary(tb testing.TB) string { return brokertest.NATSServerBinary(tb) }

// natsServerProcess starts bin with JetStream (file store in a fresh temp
// dir) on a free port and returns its URL once it answers; it is stopped
// and waited for at the test's end.
func natsServerProcess(tb testing.TB, bin string) string {
	tb.Helper()
	port := freeTCPPort(tb)
	// Its log (stderr) is left out: a banner per op.
	cmd := exec.Command(bin, "-js", "-sd", tb.TempDir(), "-a", "127.0.0.1", "-p", strconv.Itoa(port))
	if err := cmd.Start(); err != nil {
		tb.Fatalf("nats-server: %v", err)
	}
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	natsPIDs.Store(url, cmd.Process.Pid)
	waitFor(tb, "nats-server", 30*time.Second, func() bool {
		nc, err := nats.Connect(url)
		if err != nil {
			return false
		}
		nc.Close()
		return true
	})
	return url
}

// envArgs splits an environment variable's value into flags.
func envArgs(name string) []string { return strings.Fields(os.Getenv(name)) }

// startProcess starts `bin args…` serving /metrics (or /readyz) on port;
// it is interrupted and waited for at the test's end.
func startProcess(tb testing.TB, bin string, port int, args ...string) *ingestProcess {
	tb.Helper()
	p := &ingestProcess{tb: tb, port: port, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stderr = os.Stderr
	if err := p.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() { // owned by p: stop waits for it
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	tb.Cleanup(p.stop)
	return p
}

// deployedIngest starts `fanwire ingest` with the CLI's defaults (stream
// FANWIRE on db.>, file storage) and FANWIRE_BENCH_INGEST_ARGS.
func deployedIngest(tb testing.TB, bin, dsn, brokerKind, natsURL, stateDir string, extra ...string) *ingestProcess {
	tb.Helper()
	port := freeTCPPort(tb)
	args := []string{"ingest", "--pg", dsn, "--broker", brokerKind, "--nats-url", natsURL,
		"--listen", fmt.Sprintf("127.0.0.1:%d", port), "--log-level", "warn", "--state-dir", stateDir}
	args = append(append(args, extra...), envArgs("FANWIRE_BENCH_INGEST_ARGS")...)
	return startProcess(tb, bin, port, args...)
}

// deployedWS starts `fanwire ws` on the ingest's broker, anonymous
// clients allowed, with FANWIRE_BENCH_WS_ARGS, and returns its /ws URL
// once /readyz answers 200.
func deployedWS(tb testing.TB, bin, natsURL string) string {
	tb.Helper()
	port := freeTCPPort(tb)
	args := []string{"ws", "--broker", "jetstream", "--nats-url", natsURL, "--subjects", "db.>", "--listen", fmt.Sprintf("127.0.0.1:%d", port),
		"--allow-anonymous", "--log-level", "warn"}
	args = append(args, envArgs("FANWIRE_BENCH_WS_ARGS")...)
	p := startProcess(tb, bin, port, args...)
	waitFor(tb, "fanwire ws ready", time.Minute, func() bool {
		select {
		case <-p.exited:
			tb.Fatal("fanwire ws exited")
		default:
		}
		code, err := httpStatus(fmt.Sprintf("http://127.0.0.1:%d/readyz", port))
		return err == nil && code == http.StatusOK
	})
	return fmt.Sprintf("ws://127.0.0.1:%d/ws", port)
}

// cpuSeconds is the CPU time (user + system) a process has used so far.
func (p *ingestProcess) cpuSeconds() float64 {
	p.tb.Helper()
	return pidCPUSeconds(p.tb, p.cmd.Process.Pid)
}

// pidCPUSeconds is the CPU time (user + system) process pid has used.
func pidCPUSeconds(tb testing.TB, pid int) float64 {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return float64(ut+st) / 100 // USER_HZ
}

// natsPIDs maps the URL of each nats-server process to its pid.
var natsPIDs sync.Map

// waitPublished polls the process's published counter every 50 ms until it
// reaches n, and returns when it did (or fails after d). Not more often: a
// scrape (its process collector reads /proc, its answer is gzipped) is
// work for the ingest: every 5 ms it took a sixth of its CPU, every 20 ms a tenth.
func (p *ingestProcess) waitPublished(n int, d time.Duration) time.Time {
	p.tb.Helper()
	deadline := time.Now().Add(d)
	for {
		v := p.metric("fanwire_ingest_events_published_total")
		if v >= float64(n) {
			return time.Now()
		}
		select {
		case <-p.exited:
			p.tb.Fatalf("fanwire ingest exited after publishing %v events, want %d", v, n)
		default:
		}
		if time.Now().After(deadline) {
			p.tb.Fatalf("fanwire ingest: %v events published after %v, want %d", v, d, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// --- the broker's ceiling ---

// ceilingEvents are events shaped like the bootstrap's of the data set
// (the same tables, ids, keys and JSON documents, encoded with
// pgjson.AppendValue from the values' text as PostgreSQL sends them), on
// subjects "<prefix>.<table>.<key>" with the prefix left to fill in
// (setPrefix).
func ceilingEvents(ds dataSet) []ceilingEvent {
	evs := make([]ceilingEvent, 0, ds.rows())
	commit := []byte(`","lsn":"0/1A6C3E0","commit_time":"` + time.Now().UTC().Format(time.RFC3339Nano) + `","doc":{`)
	col := func(b []byte, first bool, name string, oid uint32, text string) []byte {
		if !first {
			b = append(b, ',')
		}
		b = jsonstr.AppendBytes(b, []byte(name))
		b = append(b, ':')
		b, err := pgjson.AppendValue(b, oid, []byte(text))
		if err != nil {
			panic(err)
		}
		return b
	}
	add := func(table string, id int, cols func(b []byte) []byte) {
		key := strconv.Itoa(id)
		h := sha256.Sum256([]byte(table + "\x00" + key))
		evID := "b-" + hex.EncodeToString(h[:12])
		b := make([]byte, 0, 256)
		b = append(b, `{"id":"`...)
		b = append(b, evID...)
		b = append(b, `","op":"insert","key":`...)
		b = append(b, key...)
		b = append(b, commit...)
		b = cols(b)
		b = append(b, "}}"...)
		evs = append(evs, ceilingEvent{rest: "." + table + "." + key, out: broker.Outgoing{Data: b, ID: evID}})
	}
	const (
		i4  = pgtype.Int4OID
		txt = pgtype.TextOID
		num = pgtype.NumericOID
		tsz = pgtype.TimestamptzOID
	)
	for i := 1; i <= ds.customers; i++ {
		add("customers", i, func(b []byte) []byte {
			b = col(b, true, "id", i4, strconv.Itoa(i))
			b = col(b, false, "name", txt, "Customer "+strconv.Itoa(i))
			return col(b, false, "email", txt, "customer"+strconv.Itoa(i)+"@example.com")
		})
	}
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for i := 1; i <= ds.orders; i++ {
		add("orders", i, func(b []byte) []byte {
			b = col(b, true, "id", i4, strconv.Itoa(i))
			b = col(b, false, "customer_id", i4, strconv.Itoa(1+i%ds.customers))
			b = col(b, false, "status", txt, "new")
			b = col(b, false, "total", num, fmt.Sprintf("%d.99", i%1000))
			return col(b, false, "created_at", tsz, t0.Add(time.Duration(i)*time.Second).Format("2006-01-02 15:04:05")+"+00")
		})
	}
	for i := 1; i <= ds.items; i++ {
		add("order_items", i, func(b []byte) []byte {
			b = col(b, true, "id", i4, strconv.Itoa(i))
			b = col(b, false, "order_id", i4, strconv.Itoa(1+i%ds.orders))
			b = col(b, false, "sku", txt, "SKU-"+strconv.Itoa(i%5000))
			b = col(b, false, "qty", i4, strconv.Itoa(1+i%5))
			return col(b, false, "price", num, fmt.Sprintf("%d.50", i%200))
		})
	}
	return evs
}

// ceilingEvent is an event whose subject is "<prefix>" + rest.
type ceilingEvent struct {
	rest string
	out  broker.Outgoing
}

func withPrefix(evs []ceilingEvent, prefix string) []broker.Outgoing {
	out := make([]broker.Outgoing, len(evs))
	for i, e := range evs {
		out[i] = e.out
		out[i].Subject = prefix + e.rest
	}
	return out
}

// ceiling is what measureCeiling measured, in events/s.
type ceiling struct {
	raw, broker float64
	appended    bool // the broker publisher used Append, not Publish
}

func (c ceiling) best() float64 { return max(c.raw, c.broker) }

func (c ceiling) report(b *testing.B) {
	b.ReportMetric(c.raw, "ceiling-raw-events/s")
	b.ReportMetric(c.broker, "ceiling-broker-events/s")
	b.ReportMetric(c.best(), "ceiling-events/s")
	if c.appended {
		b.ReportMetric(1, "ceiling-broker-append")
	} else {
		b.ReportMetric(0, "ceiling-broker-append")
	}
}

// ceilingStreamConfig is the JetStreamConfig `fanwire ingest` dials with
// its default flags (cmd/fanwire: --stream FANWIRE --subjects db.>
// --storage file --retention-age 24h --retention-bytes 1GiB --replicas 0
// --dedup-window 2m), on stream and subjects "<prefix>.>".
func ceilingStreamConfig(url, stream, prefix string) broker.JetStreamConfig {
	return broker.JetStreamConfig{
		NATSConfig: broker.NATSConfig{URL: url, Subjects: []string{prefix + ".>"}, Name: "fanwire-bench"},
		Stream:     stream,
		MaxAge:     24 * time.Hour,
		MaxBytes:   1 << 30,
		Storage:    "file",
		Duplicates: broker.DefaultRedisDedupWindow,
	}
}

// measureCeiling publishes evs twice into JetStream file streams made as
// the ingest makes its own: with nats.go's PublishMsgAsync (4,096
// pending, one Nats-Msg-Id each, every ack awaited), then through the
// broker package (Append if it has it, else Publish) in slices of 1,000,
// as the ingest does. Each publisher gets a stream of its own (the ids
// repeat), on subjects <prefix>… and, when prefix2 is not "", <prefix2>…
// for the second (two-letter prefixes keep the subjects' length).
func measureCeiling(tb testing.TB, url string, evs []ceilingEvent, prefix, prefix2 string) ceiling {
	tb.Helper()
	if prefix2 == "" {
		prefix2 = "ca"
		if prefix == "ca" {
			prefix2 = "cb"
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var c ceiling

	// (a) raw nats.go
	{
		msgs := withPrefix(evs, prefix)
		stream := "CEIL_RAW_" + strings.ToUpper(prefix)
		br, err := broker.DialJetStream(ctx, ceilingStreamConfig(url, stream, prefix))
		if err != nil {
			tb.Fatal(err)
		}
		br.Close()
		nc, err := nats.Connect(url)
		if err != nil {
			tb.Fatal(err)
		}
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
		if err != nil {
			tb.Fatal(err)
		}
		futs := make([]jetstream.PubAckFuture, 0, len(msgs))
		start := time.Now()
		for _, m := range msgs {
			// A publish waits up to a minute for room among the 4,096
			// pending (the default 200 ms fails on a busy machine).
			f, err := js.PublishMsgAsync(&nats.Msg{Subject: m.Subject, Data: m.Data, Header: nats.Header{jetstream.MsgIDHeader: []string{m.ID}}},
				jetstream.WithStallWait(time.Minute))
			if err != nil {
				tb.Fatalf("PublishMsgAsync: %v", err)
			}
			futs = append(futs, f)
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			tb.Fatal("the raw publisher's acks did not all come")
		}
		took := time.Since(start)
		for _, f := range futs {
			select {
			case err := <-f.Err():
				tb.Fatalf("raw publish: %v", err)
			case ack := <-f.Ok():
				if ack.Duplicate {
					tb.Fatal("raw publish: a duplicate")
				}
			}
		}
		c.raw = float64(len(msgs)) / took.Seconds()
		nc.Close()
		checkStreamMsgs(tb, url, stream, len(msgs))
	}

	// (b) the broker package
	{
		msgs := withPrefix(evs, prefix2)
		stream := "CEIL_BROKER_" + strings.ToUpper(prefix2)
		br, err := broker.DialJetStream(ctx, ceilingStreamConfig(url, stream, prefix2))
		if err != nil {
			tb.Fatal(err)
		}
		ap, ok := any(br).(broker.Appender) // as the ingest does
		c.appended = ok
		start := time.Now()
		for s := 0; s < len(msgs); s += 1000 {
			part := msgs[s:min(s+1000, len(msgs))]
			if ok {
				err = ap.Append(ctx, part, broker.AppendOptions{})
			} else {
				_, err = br.Publish(ctx, part)
			}
			if err != nil {
				tb.Fatalf("broker publish: %v", err)
			}
		}
		c.broker = float64(len(msgs)) / time.Since(start).Seconds()
		br.Close()
		checkStreamMsgs(tb, url, stream, len(msgs))
	}
	return c
}

// measureCoreCeiling publishes evs on Core NATS (subjects <prefix>…, no
// subscriber) through the broker package's Publish in slices of 1,000, as
// the ingest does with --broker nats (each slice ends with a flush
// round-trip), and returns the events/s.
func measureCoreCeiling(tb testing.TB, url string, evs []ceilingEvent, prefix string) float64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	msgs := withPrefix(evs, prefix)
	br, err := broker.DialNATS(ctx, broker.NATSConfig{URL: url, Subjects: []string{prefix + ".>"}, Name: "fanwire-bench"})
	if err != nil {
		tb.Fatal(err)
	}
	defer br.Close()
	start := time.Now()
	for s := 0; s < len(msgs); s += 1000 {
		if _, err := br.Publish(ctx, msgs[s:min(s+1000, len(msgs))]); err != nil {
			tb.Fatalf("core publish: %v", err)
		}
	}
	return float64(len(msgs)) / time.Since(start).Seconds()
}

// checkStreamMsgs fails tb unless the stream at url holds want messages.
func checkStreamMsgs(tb testing.TB, url, stream string, want int) {
	tb.Helper()
	if got := streamMsgsNamed(tb, url, stream); got != uint64(want) {
		tb.Fatalf("stream %s holds %d messages, want %d", stream, got, want)
	}
}

// --- the sub-benchmarks ---

// deployedBootstrap: the ceiling on this op's server, then `fanwire
// ingest` bootstraps the data set, timed from its start until its
// published counter reaches the row count.
func deployedBootstrap(b *testing.B, bin, natsBin, kind string, ds dataSet, evs []ceilingEvent) {
	pg := pgtest.Start(b, pgtest.Config{})
	bootstrapTables(pg, ds.orders, ds.items, ds.customers)
	url := natsServerProcess(b, natsBin)
	c := measureCeiling(b, url, evs, "ca", "cb")
	core := 0.0
	if kind == "nats" {
		core = measureCoreCeiling(b, url, evs, "cn")
	}
	start := time.Now()
	in := deployedIngest(b, bin, pg.DSN("postgres"), kind, url, b.TempDir())
	end := in.waitPublished(ds.rows(), 20*time.Minute)
	took := end.Sub(start)
	cpu := in.cpuSeconds()
	hwm := in.status("VmHWM")
	in.stop()
	rate := float64(ds.rows()) / took.Seconds()
	b.ReportMetric(rate, "rows/s")
	b.ReportMetric(took.Seconds(), "took-s")
	c.report(b)
	b.ReportMetric(100*rate/c.best(), "%-of-ceiling")
	if core > 0 {
		b.ReportMetric(core, "core-ceiling-events/s")
		b.ReportMetric(100*rate/core, "%-of-core-ceiling")
	}
	b.ReportMetric(cpu*1e6/float64(ds.rows()), "ingest-cpu-µs/row")
	b.ReportMetric(hwm, "ingest-VmHWM-MiB")
	if kind == "jetstream" {
		// The synthetic events' size against the real ones, per table.
		real, synth := realEventBytes(b, url, evs)
		b.ReportMetric(real, "event-B")
		b.ReportMetric(synth, "ceiling-event-B")
		if msgs := streamMsgsNamed(b, url, "FANWIRE"); msgs != uint64(ds.rows()) {
			b.Fatalf("the stream holds %d messages, want one per row: %d", msgs, ds.rows())
		}
	}
}

// realEventBytes is the mean size of the ingest's events of row 1 of each
// table (from the stream FANWIRE), and of the ceiling's same events.
func realEventBytes(tb testing.TB, url string, evs []ceilingEvent) (real, synth float64) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, done := openStream(tb, ctx, url, "FANWIRE")
	defer done()
	var n int
	for _, e := range evs {
		if !strings.HasSuffix(e.rest, ".1") {
			continue
		}
		m, err := st.GetLastMsgForSubject(ctx, "db"+e.rest)
		if err != nil {
			tb.Fatalf("db%s: %v", e.rest, err)
		}
		real += float64(len(m.Data))
		synth += float64(len(e.out.Data))
		n++
	}
	return real / float64(n), synth / float64(n)
}

// streamMsgsNamed is the number of messages in a stream.
func streamMsgsNamed(tb testing.TB, url, stream string) uint64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, done := openStream(tb, ctx, url, stream)
	defer done()
	info, err := st.Info(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	return info.State.Msgs
}

// openStream looks up a stream on the server at url, over a connection of
// its own that done closes.
func openStream(tb testing.TB, ctx context.Context, url, stream string) (st jetstream.Stream, done func()) {
	tb.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		tb.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		tb.Fatal(err)
	}
	if st, err = js.Stream(ctx, stream); err != nil {
		nc.Close()
		tb.Fatal(err)
	}
	return st, nc.Close
}

// deployedTail is one tail op: setup, an ingest process bootstraps and
// stops, the reference slot is made, write runs, then (when evs is not
// nil) the ceiling on this op's server, then a new ingest process catches
// up, timed from its start until it has published n events (or, with ws,
// until a WebSocket client of a `fanwire ws` process subscribed to
// wsSubject has received them), then pg_recvlogical reads the same WAL.
func deployedTail(b *testing.B, bin, natsBin string, n int, evs []ceilingEvent, wsSubject string,
	setup func(*pgtest.Server), boot int, write func(*pgtest.Server)) {
	pg := pgtest.Start(b, pgtest.Config{})
	setup(pg)
	url := natsServerProcess(b, natsBin)
	state := b.TempDir()
	in := deployedIngest(b, bin, pg.DSN("postgres"), "jetstream", url, state)
	in.waitPublished(boot, 10*time.Minute)
	in.waitReady()
	in.stop()
	r := &benchRig{tb: b, pg: pg}
	pg.Exec("postgres", "SELECT pg_create_logical_replication_slot('bench_ref', 'pgoutput')")
	write(pg)
	endpos := r.lsn()
	var c ceiling
	if evs != nil {
		c = measureCeiling(b, url, evs, "ca", "cb")
	}
	var client *wsCounter
	if wsSubject != "" {
		client = dialWSCounter(b, deployedWS(b, bin, url), wsSubject, n)
	}
	natsPID, _ := natsPIDs.Load(url)
	_, wal0, _ := cpuTimes(b)
	nats0 := pidCPUSeconds(b, natsPID.(int))
	start := time.Now()
	in = deployedIngest(b, bin, pg.DSN("postgres"), "jetstream", url, state)
	published := in.waitPublished(n, 10*time.Minute).Sub(start)
	cpu := in.cpuSeconds()
	_, wal1, _ := cpuTimes(b)
	natsCPU := pidCPUSeconds(b, natsPID.(int)) - nats0
	hwm := in.status("VmHWM")
	if got := in.metric("fanwire_ingest_events_published_total"); got != float64(n) {
		b.Fatalf("published %v events, want %d", got, n)
	}
	took := published
	if client != nil {
		took = client.wait(10 * time.Minute).Sub(start)
	}
	in.stop()
	ref := r.recvlogical(endpos)
	rate := float64(n) / took.Seconds()
	refRate := float64(n) / ref.Seconds()
	if client != nil {
		b.ReportMetric(float64(n)/published.Seconds(), "published-changes/s")
		b.ReportMetric(rate, "ws-changes/s")
	} else {
		b.ReportMetric(rate, "changes/s")
	}
	b.ReportMetric(refRate, "ref-changes/s")
	b.ReportMetric(100*rate/refRate, "%-of-ref")
	if evs != nil {
		c.report(b)
		b.ReportMetric(100*rate/c.best(), "%-of-ceiling")
	}
	b.ReportMetric(cpu*1e6/float64(n), "ingest-cpu-µs/change")
	b.ReportMetric(hwm, "ingest-VmHWM-MiB")
	// The machine's CPU per change until the broker acknowledged the last:
	// PostgreSQL decoding (its walsender), the broker storing, the ingest.
	// Two cores give at most 2 s of it per second: that bounds any ingest.
	walCPU := (wal1 - wal0).Seconds()
	b.ReportMetric(walCPU*1e6/float64(n), "walsender-cpu-µs/change")
	b.ReportMetric(natsCPU*1e6/float64(n), "nats-cpu-µs/change")
	b.ReportMetric(2*float64(n)/(walCPU+natsCPU+cpu), "2-core-bound-changes/s")
}

// deployedTailUpdate: one UPDATE of every order (100k) in one transaction.
func deployedTailUpdate(b *testing.B, bin, natsBin string, orders int, evs []ceilingEvent, ws bool) {
	subject := ""
	if ws {
		subject = "db.orders.>"
	}
	deployedTail(b, bin, natsBin, orders, evs, subject,
		func(pg *pgtest.Server) { bootstrapTables(pg, orders, 0, 0) }, orders,
		func(pg *pgtest.Server) { pg.Exec("postgres", "UPDATE orders SET status = 'paid', total = total + 1") })
}

// deployedTailSmallTxns: n single-row INSERT transactions from 4 writers.
func deployedTailSmallTxns(b *testing.B, bin, natsBin string, n int) {
	deployedTail(b, bin, natsBin, n, nil, "",
		func(pg *pgtest.Server) { bootstrapTables(pg, 0, 0, 0) }, 0,
		func(pg *pgtest.Server) { insertConcurrently(b, pg.DSN("postgres"), 4, n) })
}

// deployedLatency: commit → WebSocket client through the ingest and ws
// processes, at rate single-row transactions/s for seconds (latencyRun).
func deployedLatency(b *testing.B, bin, natsBin string, rate, seconds int) {
	pg := pgtest.Start(b, pgtest.Config{})
	pg.Exec("postgres", "CREATE TABLE lat (id int PRIMARY KEY, n int)")
	url := natsServerProcess(b, natsBin)
	in := deployedIngest(b, bin, pg.DSN("postgres"), "jetstream", url, b.TempDir())
	in.waitReady()
	wsURL := deployedWS(b, bin, url)
	lat := latencyRun(b, &benchRig{tb: b, pg: pg}, wsURL, rate, seconds)
	hwm := in.status("VmHWM")
	// Where the tail is: the share of commits the broker had acknowledged
	// to the ingest within 2 and 4 ms (its histogram's buckets), beside
	// the client's figures.
	count := in.metric("fanwire_ingest_commit_to_ack_seconds_count")
	for _, le := range []string{"0.002", "0.004"} {
		acked := in.metric(`fanwire_ingest_commit_to_ack_seconds_bucket{le="` + le + `"}`)
		b.ReportMetric(100*acked/count, "ingest-acked-within-"+le+"s-%")
	}
	in.stop()
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.95), "p95-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
	b.ReportMetric(hwm, "ingest-VmHWM-MiB")
}

// deployedProjectionUpdate: the ingest with benchProjection's projection
// in mode, on pgtest.OrdersDataSet (scaled); one UPDATE of every order's
// status, timed from its commit until every document is published.
func deployedProjectionUpdate(b *testing.B, bin, natsBin, mode string, ds dataSet) {
	pg := pgtest.Start(b, pgtest.Config{})
	pg.Exec("postgres", scaledOrdersDataSet(b, ds)...)
	url := natsServerProcess(b, natsBin)
	cfg := filepath.Join(b.TempDir(), "projections.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`projections:
  - name: orders
    table: orders
    key: id
    mode: %s
    embed:
      - as: items
        table: order_items
        on: {order_id: id}
        many: true
        order_by: id
      - as: customer
        table: customers
        on: {id: customer_id}
`, mode)), 0o644); err != nil {
		b.Fatal(err)
	}
	in := deployedIngest(b, bin, pg.DSN("postgres"), "jetstream", url, b.TempDir(), "--config", cfg)
	in.waitPublished(ds.orders, 10*time.Minute)
	in.waitReady()
	base := in.metric("fanwire_ingest_events_published_total")
	if base != float64(ds.orders) {
		b.Fatalf("bootstrap published %v documents, want %d", base, ds.orders)
	}
	readyHWM, readyRSS, readyAnon := in.status("VmHWM"), in.status("VmRSS"), in.status("RssAnon")
	stateRows, stateBytes := in.metric("fanwire_projection_memory_rows"), in.metric("fanwire_projection_memory_value_bytes")
	cpu0 := in.cpuSeconds()
	conn, err := pgx.Connect(context.Background(), pg.DSN("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(context.Background())
	// The reference: pg_recvlogical decodes the same WAL afterwards. From
	// the commit, PostgreSQL decodes the whole transaction before it sends
	// its first change, so no document can be published sooner.
	pg.Exec("postgres", "SELECT pg_create_logical_replication_slot('bench_ref', 'pgoutput')")
	if _, err := conn.Exec(context.Background(), "UPDATE orders SET status = 'paid'"); err != nil {
		b.Fatal(err)
	}
	start := time.Now() // from the commit, as BenchmarkProjectionUpdate: not PostgreSQL's own time to update
	_, wal0, backends0 := cpuTimes(b)
	r := &benchRig{tb: b, pg: pg}
	endpos := r.lsn()
	end := in.waitPublished(2*ds.orders, 10*time.Minute)
	took := end.Sub(start)
	cpu := in.cpuSeconds() - cpu0
	// PostgreSQL's side from the commit: decoding (its walsenders), and its
	// other processes: the backends of the sql mode's queries (and the
	// cluster's background work, which the memory mode's figure shows).
	_, wal1, backends1 := cpuTimes(b)
	hwm := in.status("VmHWM")
	time.Sleep(200 * time.Millisecond) // any event too many
	if got := in.metric("fanwire_ingest_events_published_total"); got != float64(2*ds.orders) {
		b.Fatalf("published %v events, want %d", got, 2*ds.orders)
	}
	in.stop()
	ref := r.recvlogical(endpos)
	b.ReportMetric(float64(ds.orders)/ref.Seconds(), "ref-changes/s")
	b.ReportMetric(100*ref.Seconds()/took.Seconds(), "%-of-ref")
	b.ReportMetric(float64(ds.orders)/took.Seconds(), "docs/s")
	b.ReportMetric(cpu*1e6/float64(ds.orders), "ingest-cpu-µs/doc")
	b.ReportMetric(float64((wal1-wal0).Microseconds())/float64(ds.orders), "walsender-cpu-µs/doc")
	b.ReportMetric(float64((backends1-backends0).Microseconds())/float64(ds.orders), "pg-backends-cpu-µs/doc")
	b.ReportMetric(readyHWM, "ready-VmHWM-MiB")
	b.ReportMetric(readyRSS, "ready-VmRSS-MiB")
	b.ReportMetric(readyAnon, "ready-RssAnon-MiB") // without the files mapped (the memory state's bbolt file)
	b.ReportMetric(hwm, "ingest-VmHWM-MiB")
	if stateRows > 0 { // the memory mode's state: its rows, and its values' bytes per row
		b.ReportMetric(stateRows, "state-rows")
		b.ReportMetric(stateBytes/stateRows, "state-value-B/row")
	}
}

// scaledOrdersDataSet is pgtest.OrdersDataSet with ds's sizes.
func scaledOrdersDataSet(tb testing.TB, ds dataSet) []string {
	tb.Helper()
	pairs := []string{
		"generate_series(1, 10000)", fmt.Sprintf("generate_series(1, %d)", ds.customers),
		"i % 10000", fmt.Sprintf("i %% %d", ds.customers),
		"generate_series(1, 100000)", fmt.Sprintf("generate_series(1, %d)", ds.orders),
		"generate_series(1, 300000)", fmt.Sprintf("generate_series(1, %d)", 3*ds.orders),
	}
	all := strings.Join(pgtest.OrdersDataSet, "\n")
	for i := 0; i < len(pairs); i += 2 {
		if !strings.Contains(all, pairs[i]) {
			tb.Fatalf("pgtest.OrdersDataSet has no %q any more: scaledOrdersDataSet needs updating", pairs[i])
		}
	}
	r := strings.NewReplacer(pairs...)
	out := make([]string, len(pgtest.OrdersDataSet))
	for i, s := range pgtest.OrdersDataSet {
		out[i] = r.Replace(s)
	}
	return out
}

// --- a WebSocket client counting events ---

// wsCounter is a WebSocket client counting the events it receives.
type wsCounter struct {
	tb      testing.TB
	mu      sync.Mutex
	n       int       // events received
	target  int       // when n reaches it, reached is set
	reached time.Time // when n reached target
	err     error     // why reading stopped
}

// dialWSCounter connects to the gateway, subscribes to subject and counts
// the events that arrive, in a goroutine that ends with the test; it
// notes when the count reaches target.
func dialWSCounter(tb testing.TB, url, subject string, target int) *wsCounter {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		cancel()
		tb.Fatal(err)
	}
	c.SetReadLimit(1 << 20)
	done := make(chan struct{})
	tb.Cleanup(func() {
		cancel()
		_ = c.CloseNow()
		<-done
	})
	w := &wsCounter{tb: tb, target: target}
	if _, _, err := c.Read(ctx); err != nil { // ready
		close(done)
		tb.Fatal(err)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"subscribe","id":"s","subject":"`+subject+`"}`)); err != nil {
		close(done)
		tb.Fatal(err)
	}
	if _, data, err := c.Read(ctx); err != nil || !bytes.Contains(data, []byte(`"subscribed"`)) {
		close(done)
		tb.Fatalf("subscribe: %v %s", err, data)
	}
	go func() {
		defer close(done)
		event := []byte(`{"type":"event",`)
		for {
			_, data, err := c.Read(ctx)
			now := time.Now()
			w.mu.Lock()
			if err != nil {
				w.err = err
				w.mu.Unlock()
				return
			}
			// A frame may carry several events, one per line.
			w.n += bytes.Count(data, event)
			if w.n >= w.target && w.reached.IsZero() {
				w.reached = now
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// wait returns when the target count of events had arrived.
func (w *wsCounter) wait(d time.Duration) time.Time {
	w.tb.Helper()
	deadline := time.Now().Add(d)
	for {
		w.mu.Lock()
		n, reached, err := w.n, w.reached, w.err
		w.mu.Unlock()
		if !reached.IsZero() {
			return reached
		}
		if err != nil {
			w.tb.Fatalf("WebSocket client, after %d events: %v", n, err)
		}
		if time.Now().After(deadline) {
			w.tb.Fatalf("WebSocket client: %d events after %v, want %d", n, d, w.target)
		}
		time.Sleep(time.Millisecond)
	}
}

// httpStatus is the status code of a GET of url.
func httpStatus(url string) (int, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err
	}
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}
