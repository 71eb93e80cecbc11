package broker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
)

func dialJS(t *testing.T, cfg broker.JetStreamConfig) *broker.JetStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := broker.DialJetStream(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func TestJetStreamPublishConsumeWithCursors(t *testing.T) {
	ns := brokertest.NATS(t)
	b := dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"db.>", "app.>"}}, Stream: "T1"})
	// Stored before the consumer starts: not delivered (live from the node's start).
	if _, err := b.Publish(context.Background(), []broker.Outgoing{{Subject: "app.old", Data: []byte(`0`)}}); err != nil {
		t.Fatal(err)
	}
	c := consume(t, b)
	var out []broker.Outgoing
	for i := range 300 {
		out = append(out, broker.Outgoing{Subject: fmt.Sprintf("db.t.%d", i), Data: []byte(fmt.Sprint(i)), ID: fmt.Sprint("id-", i)})
	}
	cursors, err := b.Publish(context.Background(), out)
	if err != nil {
		t.Fatal(err)
	}
	for i, cur := range cursors {
		if want := broker.FormatJSCursor(uint64(i + 2)); cur != want {
			t.Fatalf("cursor %d = %q, want %q", i, cur, want)
		}
	}
	got := c.waitFor(t, 300)
	for i, m := range got {
		if string(m.Data) != fmt.Sprint(i) || m.Cursor != cursors[i] {
			t.Fatalf("message %d: %q cursor %q, want %d %q", i, m.Data, m.Cursor, i, cursors[i])
		}
	}
	// A repeated id is deduplicated: acked with the original sequence, not delivered again.
	again, err := b.Publish(context.Background(), out[:1])
	if err != nil {
		t.Fatal(err)
	}
	if again[0] != cursors[0] {
		t.Fatalf("republished id got cursor %q, want the original %q", again[0], cursors[0])
	}
	sentinel, err := b.Publish(context.Background(), []broker.Outgoing{{Subject: "app.end", Data: []byte(`"end"`)}})
	if err != nil {
		t.Fatal(err)
	}
	got = c.waitFor(t, 301)
	if len(got) != 301 || got[300].Cursor != sentinel[0] {
		t.Fatalf("after the duplicate: %d messages, last %q; want 301 ending with the sentinel %q", len(got), got[len(got)-1].Cursor, sentinel[0])
	}
}

func TestJetStreamStreamSettings(t *testing.T) {
	ns := brokertest.NATS(t)
	url := ns.ClientURL()
	dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: url, Subjects: []string{"a.>"}}, Stream: "S", MaxAge: time.Hour})
	// Changeable settings are updated in place.
	dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: url, Subjects: []string{"a.>", "b.>"}}, Stream: "S", MaxAge: 2 * time.Hour})
	// Storage cannot change: a clear error naming it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := broker.DialJetStream(ctx, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: url, Subjects: []string{"a.>"}}, Stream: "S", Storage: "memory"})
	if err == nil || !strings.Contains(err.Error(), "storage") {
		t.Fatalf("storage change: %v, want an error naming storage", err)
	}
	_, err = broker.DialJetStream(ctx, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: url, Subjects: []string{"a.>"}}, Storage: "disk"})
	if err == nil || !strings.Contains(err.Error(), "disk") {
		t.Fatalf("bad storage: %v", err)
	}
	_, err = broker.DialJetStream(ctx, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: url}})
	if err == nil || !strings.Contains(err.Error(), "--subjects") {
		t.Fatalf("stream on every subject: %v, want an error pointing at --subjects", err)
	}
}

func TestParseJSCursor(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"js:1", 1, true}, {"js:18446744073709551615", 1<<64 - 1, true},
		{"js:0", 0, false}, {"js:", 0, false}, {"js:01", 0, false}, {"js:-1", 0, false},
		{"js:1x", 0, false}, {"rs:1-0", 0, false}, {"1", 0, false}, {"", 0, false},
		{"js:18446744073709551616", 0, false},
	} {
		got, err := broker.ParseJSCursor(tc.in)
		if tc.ok && (err != nil || got != tc.want) {
			t.Errorf("ParseJSCursor(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
		if !tc.ok && !errors.Is(err, broker.ErrBadCursor) {
			t.Errorf("ParseJSCursor(%q) = %d, %v; want ErrBadCursor", tc.in, got, err)
		}
		if tc.ok && broker.FormatJSCursor(got) != tc.in {
			t.Errorf("FormatJSCursor(%d) != %q", got, tc.in)
		}
	}
}
