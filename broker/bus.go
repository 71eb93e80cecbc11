package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Bus is implemented by brokers that carry small messages between the ws
// nodes sharing them, beside the event stream: nothing is stored, a
// message reaches the nodes listening when it is sent (at most once), and
// each sender's messages arrive in the order it sent them. The ws role's
// presence runs on it; its protocol numbers each node's messages and
// detects a loss itself (gateway/presence_bus.go).
//
// Core NATS and JetStream send on the core subject BusSubject(stream)
// (JetStream's stream never captures it: it starts with '$'); Redis on
// the Pub/Sub channel "<stream>:bus".
type Bus interface {
	// BusSend sends data to every node listening, this one included.
	BusSend(ctx context.Context, data []byte) error
	// BusListen calls h with each message, on one goroutine, until ctx is
	// done or the broker is closed; it calls ready once listening is in
	// place (again after a reconnect, when messages may have been lost
	// meanwhile). h must not keep data. It returns the reason it stopped.
	BusListen(ctx context.Context, h func(data []byte), ready func()) error
	// BusLimit is the largest message BusSend takes.
	BusLimit() int
}

// busSubjectRoot starts every bus subject: a system subject ('$'), which
// no stream captures and the ws role never delivers as an event.
const busSubjectRoot = "$FANWIRE.bus"

// BusSubject is the NATS subject of the bus of the nodes sharing stream
// ("" for Core NATS, which has none).
func BusSubject(stream string) string {
	if stream == "" {
		return busSubjectRoot
	}
	return busSubjectRoot + "." + stream
}

// isBusSubject reports whether a message a Core NATS subscription to the
// subject space received is the bus's (a pattern such as ">" matches it).
func isBusSubject(s string) bool {
	return strings.HasPrefix(s, busSubjectRoot) && (len(s) == len(busSubjectRoot) || s[len(busSubjectRoot)] == '.')
}

// busRetry is the wait before a Redis listener receives again after an
// error (the library reconnects meanwhile).
const busRetry = 250 * time.Millisecond

// busBuffer bounds the messages a listener holds for a busy handler;
// beyond it the client library drops them (the protocol sees the gap).
const busBuffer = 64 << 10

func natsBusSend(ctx context.Context, nc *nats.Conn, subject string, data []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !nc.IsConnected() {
		return errors.New("bus: nats is not connected")
	}
	if err := nc.Publish(subject, data); err != nil {
		return fmt.Errorf("bus: %w", err)
	}
	return nil
}

func natsBusListen(ctx context.Context, b *NATS, subject string, h func([]byte), ready func()) error {
	ch := make(chan *nats.Msg, busBuffer)
	sub, err := b.nc.ChanSubscribe(subject, ch)
	if err != nil {
		return fmt.Errorf("bus: subscribe %q: %w", subject, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := b.flush(ctx); err != nil {
		return fmt.Errorf("bus: subscribe: %w", err)
	}
	ready()
	for {
		select {
		case m := <-ch:
			h(m.Data)
		case <-ctx.Done():
			return ctx.Err()
		case <-b.closed:
			return ErrClosed
		}
	}
}

// BusSend publishes data on the bus subject.
func (b *NATS) BusSend(ctx context.Context, data []byte) error {
	return natsBusSend(ctx, b.nc, BusSubject(""), data)
}

// BusListen subscribes to the bus subject.
func (b *NATS) BusListen(ctx context.Context, h func([]byte), ready func()) error {
	return natsBusListen(ctx, b, BusSubject(""), h, ready)
}

// BusLimit is the server's largest message.
func (b *NATS) BusLimit() int { return int(b.nc.MaxPayload()) }

// BusSend publishes data on the stream's bus subject.
func (b *JetStream) BusSend(ctx context.Context, data []byte) error {
	return natsBusSend(ctx, b.core.nc, BusSubject(b.cfg.Stream), data)
}

// BusListen subscribes to the stream's bus subject.
func (b *JetStream) BusListen(ctx context.Context, h func([]byte), ready func()) error {
	return natsBusListen(ctx, b.core, BusSubject(b.cfg.Stream), h, ready)
}

// BusLimit is the server's largest message.
func (b *JetStream) BusLimit() int { return int(b.core.nc.MaxPayload()) }

func (b *Redis) busChannel() string { return b.cfg.Stream + ":bus" }

// BusSend publishes data on the stream's bus channel.
func (b *Redis) BusSend(ctx context.Context, data []byte) error {
	if err := b.rdb.Publish(ctx, b.busChannel(), data).Err(); err != nil {
		return fmt.Errorf("bus: %w", err)
	}
	return nil
}

// BusListen subscribes to the stream's bus channel. The client library
// subscribes again after a lost connection; each (re)subscription calls
// ready.
func (b *Redis) BusListen(ctx context.Context, h func([]byte), ready func()) error {
	ps := b.rdb.Subscribe(ctx)
	defer ps.Close()
	if err := ps.Subscribe(ctx, b.busChannel()); err != nil {
		return fmt.Errorf("bus: subscribe: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer stop()
	for {
		msg, err := ps.Receive(ctx)
		if err != nil {
			select {
			case <-b.closed:
				return ErrClosed
			default:
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if errors.Is(err, redis.ErrClosed) {
				return ErrClosed
			}
			// A lost connection: Receive reconnects and subscribes
			// again on its next call, which then answers with the
			// subscription (ready below).
			b.log.Debug("bus: receive", zap.Error(err))
			t := time.NewTimer(busRetry)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				ready()
			}
		case *redis.Message:
			h([]byte(m.Payload))
		}
	}
}

// BusLimit bounds a bus message on Redis (the server takes up to 512 MB;
// nodes keep theirs far smaller).
func (b *Redis) BusLimit() int { return 1 << 20 }
