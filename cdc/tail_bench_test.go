package cdc

import (
	"bytes"
	"context"
	"encoding/binary"
	"runtime"
	"runtime/debug"
	"strconv"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/fanwire/fanwire/cdc/pgjson"
)

// pgUpdate is an Update message with the new row only (REPLICA IDENTITY
// DEFAULT, the key unchanged).
func pgUpdate(rel uint32, vals ...string) []byte {
	ins := pgInsert(rel, vals...)
	return append([]byte{'U'}, ins[1:]...)
}

// pgTime is t as pgoutput sends it: microseconds since 2000-01-01 UTC.
func pgTime(t time.Time) uint64 {
	return uint64(t.Sub(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).Microseconds())
}

// BenchmarkTailChanges measures the tail's own work per change, without
// PostgreSQL or a broker: one op is one transaction of 10,000 UPDATEs of
// an orders row (the data set of the tail benchmarks: id, customer_id,
// status, total, created_at; the new row only, as REPLICA IDENTITY DEFAULT
// sends it), its pgoutput messages (prebuilt) each copied into one receive
// buffer, as pgconn reuses its own, then checked, held and committed
// through reader.handle into events, which a drain takes from the publisher's
// queue and drops. allocs/change and B/change count every allocation;
// cpu-ns/change is the process's CPU time (the drain's included), less
// skewed than wall-clock time by other work on the machine.
func BenchmarkTailChanges(b *testing.B) { benchTailChanges(b, 1, 10_000, 0, false) }

// BenchmarkTailChangesSmallTxns is BenchmarkTailChanges with 10,000 transactions
// of one change each, as in BenchmarkDeployed's tail-smalltxns: what a
// transaction costs beyond its changes (its begin and commit, its
// hand-over to the publisher, its held changes' first memory).
func BenchmarkTailChangesSmallTxns(b *testing.B) { benchTailChanges(b, 10_000, 1, 0, false) }

// BenchmarkTailChangesBig is BenchmarkTailChanges with one transaction of
// 100,000 changes, as in BenchmarkDeployed's tail-update, under the
// default MaxTxnMemory (32 MiB), which its held messages (~14 MB) fit;
// the Go heap's soft limit is the ingest command's default (--memory-limit
// 64 MiB) meanwhile.
func BenchmarkTailChangesBig(b *testing.B) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(64 << 20))
	benchTailChanges(b, 1, 100_000, 0, false)
}

// BenchmarkTailChangesSpilled is BenchmarkTailChangesBig with a
// MaxTxnMemory of 4 MiB: the transaction spills, and is read back at its
// commit.
func BenchmarkTailChangesSpilled(b *testing.B) {
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(64 << 20))
	benchTailChanges(b, 1, 100_000, 4<<20, true)
}

// benchTailChanges: see BenchmarkTailChanges; one op is txns transactions
// of n changes; maxTxn is MaxTxnMemory (0: the default), spills whether
// the transactions must spill.
func benchTailChanges(b *testing.B, txns, n int, maxTxn int64, spills bool) {
	const rel = 16384
	cols := []string{"id", "customer_id", "status", "total", "created_at"}
	oids := []uint32{23, 23, 25, 1700, 1184}
	commit := time.Date(2026, 12, 1, 19, 37, 3, 123456000, time.UTC)
	const lsn, end = 0x1_6B37_48A0, 0x1_6B37_48D8
	relMsg := pgRelationTyped(rel, "public", "orders", cols, oids)
	begin := []byte{'B'}
	begin = binary.BigEndian.AppendUint64(begin, lsn)
	begin = binary.BigEndian.AppendUint64(begin, pgTime(commit))
	begin = binary.BigEndian.AppendUint32(begin, 7)
	ups := make([][]byte, n)
	for i := range ups {
		id := 1 + i
		created := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC).Add(time.Duration(id) * time.Second)
		ups[i] = pgUpdate(rel, strconv.Itoa(id), strconv.Itoa(1+id%10_000), "paid", strconv.Itoa(id%1000+1)+".99", created.Format("2006-01-02 15:04:05+00"))
	}
	com := []byte{'C', 0}
	com = binary.BigEndian.AppendUint64(com, lsn)
	com = binary.BigEndian.AppendUint64(com, end)
	com = binary.BigEndian.AppendUint64(com, pgTime(commit))

	cfg := Config{StateDir: b.TempDir(), MaxTxnMemory: maxTxn}
	cfg.setDefaults()
	in := &Ingest{cfg: cfg, log: zap.NewNop()}
	pub := newPublisher(in, nil, nil, "", nil)
	r := &reader{in: in, rels: newRelations("db", nil, 0, pgjson.NewTypeCache(), nil), pub: pub, streamed: make(map[uint32]*txn)}
	defer r.close()
	ctx, cancel := context.WithCancel(context.Background())
	events := make(chan int)
	go func() { // the broker that drops
		total := 0
		for {
			select {
			case p := <-pub.ch:
				pub.q.give(p.events, p.bytes)
				total += len(p.evs)
			case <-ctx.Done(): // everything is queued by now
				for len(pub.ch) > 0 {
					total += len((<-pub.ch).evs)
				}
				events <- total
				return
			}
		}
	}()
	if err := r.handle(ctx, bytes.Clone(relMsg)); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	cpu0 := cpuTime(b)
	changes := 0
	var buf []byte // the receive buffer, reused as pgconn reuses its own
	recv := func(m []byte) error {
		buf = append(buf[:0], m...)
		return r.handle(ctx, buf)
	}
	for b.Loop() {
		for range txns {
			if err := recv(begin); err != nil {
				b.Fatal(err)
			}
			for _, m := range ups {
				if err := recv(m); err != nil {
					b.Fatal(err)
				}
			}
			if err := recv(com); err != nil {
				b.Fatal(err)
			}
			changes += n
		}
	}
	if spilled := in.spilled.Load() > 0; spilled != spills {
		b.Fatalf("spilled: %v, want %v", spilled, spills)
	}
	cpu := cpuTime(b) - cpu0
	runtime.ReadMemStats(&after)
	cancel()
	if got := <-events; got != changes {
		b.Fatalf("%d events of %d changes", got, changes)
	}
	b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(changes), "allocs/change")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(changes), "B/change")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(changes), "cpu-ns/change")
}
