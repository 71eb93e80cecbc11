package loadtest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func TestPublish(t *testing.T) {
	url := startNATS(t)
	tests := []struct {
		name   string
		events int
		size   int
		rate   int
	}{
		{"burst", 5000, 256, 0},
		{"paced", 300, 100, 3000}, // 299 intervals of 1/3000 s: at least 99.7 ms
		{"tiny payload", 50, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := t.Context()
			cfg := &Config{NATSURL: url, Events: tt.events, Size: tt.size, Rate: tt.rate,
				Subject: "loadtest.test." + tt.name[:4], Timeout: 10 * time.Second}
			nc, err := connectNATS(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			sub, err := nc.SubscribeSync(cfg.Subject)
			if err != nil {
				t.Fatal(err)
			}
			if err := sub.SetPendingLimits(-1, -1); err != nil {
				t.Fatal(err)
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}

			start := time.Now()
			if err := publish(ctx, natsSink{nc}, cfg, nil); err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)

			var firstTS, lastTS int64
			for i := 1; i <= tt.events; i++ {
				m, err := sub.NextMsg(5 * time.Second)
				if err != nil {
					t.Fatalf("event %d: %v", i, err)
				}
				var p struct{ Seq, TS int64 }
				if err := json.Unmarshal(m.Data, &p); err != nil {
					t.Fatalf("event %d: %v: %s", i, err, m.Data)
				}
				if p.Seq != int64(i) {
					t.Fatalf("event %d has seq %d", i, p.Seq)
				}
				if p.TS < lastTS || p.TS < start.UnixNano() || p.TS > time.Now().UnixNano() {
					t.Fatalf("event %d: ts %d out of order or outside the publish window", i, p.TS)
				}
				if len(m.Data) < tt.size || (tt.size >= 64 && len(m.Data) != tt.size) {
					t.Fatalf("event %d: %d bytes, want %d", i, len(m.Data), tt.size)
				}
				if i == 1 {
					firstTS = p.TS
				}
				lastTS = p.TS
			}
			if m, err := sub.NextMsg(50 * time.Millisecond); err != nats.ErrTimeout {
				t.Fatalf("extra message after the last event: %v %v", m, err)
			}
			if tt.rate > 0 {
				span := time.Duration(lastTS - firstTS)
				want := time.Duration(tt.events-1) * time.Second / time.Duration(tt.rate)
				if span < want-time.Millisecond || took > 20*want {
					t.Errorf("paced at %d/s: events span %v (want ≥ %v), publish took %v", tt.rate, span, want, took)
				}
			}
		})
	}
}

func TestPublishHonoursContext(t *testing.T) {
	url := startNATS(t)
	cfg := &Config{NATSURL: url, Events: 1_000_000, Size: 64, Rate: 10, Subject: "loadtest.test.ctx", Timeout: 10 * time.Second}
	nc, err := connectNATS(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := publish(ctx, natsSink{nc}, cfg, nil); err != context.DeadlineExceeded {
		t.Fatalf("err = %v, want context.DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("publish took %v to notice its context", took)
	}
}
