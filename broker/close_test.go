package broker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
)

// TestCloseEndsConsume: doc.go promises that Close stops Consume. A
// Consume on a context that is never cancelled must return soon after
// Close, with nil or ErrClosed, on every broker (Redis retried its closed
// client every 250 ms forever, JetStream's feed waited for its context).
func TestCloseEndsConsume(t *testing.T) {
	t.Parallel()
	brokers := map[string]func(t *testing.T) broker.Broker{
		"nats": func(t *testing.T) broker.Broker {
			ns := brokertest.NATS(t)
			return dial(t, ns.ClientURL(), "app.>")
		},
		"jetstream": func(t *testing.T) broker.Broker {
			ns := brokertest.NATS(t)
			return dialJS(t, broker.JetStreamConfig{NATSConfig: broker.NATSConfig{URL: ns.ClientURL(), Subjects: []string{"app.>", "db.>"}}})
		},
		"redis": func(t *testing.T) broker.Broker {
			return dialRedis(t, broker.RedisConfig{URL: "redis://" + brokertest.Redis(t)})
		},
	}
	for name, open := range brokers {
		t.Run(name, func(t *testing.T) {
			b := open(t)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := b.Publish(ctx, []broker.Outgoing{{Subject: "app.x", Data: []byte("1")}}); err != nil {
				t.Fatal(err)
			}
			started := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				done <- b.Consume(context.Background(), func([]broker.Message, time.Time) {}, func(string) { close(started) })
			}()
			select {
			case <-started:
			case err := <-done:
				t.Fatalf("Consume ended before it started: %v", err)
			case <-time.After(10 * time.Second):
				t.Fatal("Consume did not start")
			}
			closed := time.Now()
			if err := b.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			select {
			case err := <-done:
				if err != nil && !errors.Is(err, broker.ErrClosed) {
					t.Errorf("Consume returned %v after Close, want nil or ErrClosed", err)
				}
				if d := time.Since(closed); d > 2*time.Second {
					t.Errorf("Consume returned %v after Close, want within 2s", d)
				}
			case <-time.After(2 * time.Second):
				t.Fatal("Consume still running 2s after Close")
			}
		})
	}
}
