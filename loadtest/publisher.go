package loadtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/redact"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	// paceInterval is how often a rate-limited publisher wakes to publish the
	// events that have come due: a sleep per event would cost a timer wake-up
	// each and cannot go below the timer's resolution anyway.
	paceInterval = time.Millisecond
	// ctxCheckEvery is how many burst publishes may pass between ctx checks.
	ctxCheckEvery = 1024
)

// connectNATS connects the publisher. It does not reconnect: a broker that
// drops the publisher mid-run has invalidated the run, and the run says so.
func connectNATS(ctx context.Context, cfg *Config) (*nats.Conn, error) {
	nc, err := nats.Connect(cfg.NATSURL,
		nats.Name("fanwire-loadtest"),
		nats.NoReconnect(),
		nats.Timeout(cfg.Timeout),
		nats.SetCustomDialer(ctxDialer{ctx: ctx, d: net.Dialer{Timeout: cfg.Timeout}}),
	)
	if err != nil {
		return nil, fmt.Errorf("connect nats %s: %w", redact.NATSURL(cfg.NATSURL), err)
	}
	if limit := nc.MaxPayload(); int64(cfg.Size) > limit {
		nc.Close()
		return nil, fmt.Errorf("%w: Size %d is over the NATS server's max_payload %d", ErrInvalidConfig, cfg.Size, limit)
	}
	return nc, nil
}

// ctxDialer makes nats.Connect's dial honour ctx (nats.Connect takes none).
type ctxDialer struct {
	ctx context.Context
	d   net.Dialer
}

func (c ctxDialer) Dial(network, address string) (net.Conn, error) {
	return c.d.DialContext(c.ctx, network, address)
}

// publish sends events 1..cfg.Events to cfg.Subject (in a view run, each
// to its document's subject), each stamped with its publish time, and returns once the server has them all (a flush round trip).
// With cfg.Rate > 0 it wakes every paceInterval and publishes the events that
// have come due, so the average rate is exact and batches stay small (Rate/1000).
// count, when not nil, counts the events handed to the sink so far.
func publish(ctx context.Context, out sink, cfg *Config, count *atomic.Int64) error {
	buf := make([]byte, 0, cfg.Size+64) // sinks copy the payload, so one will do
	subject := cfg.Subject
	var subj []byte // a view run's per-event subject
	var tick <-chan time.Time
	if cfg.Rate > 0 {
		t := time.NewTicker(paceInterval)
		defer t.Stop()
		tick = t.C
	}
	start := time.Now()
	for sent := 0; sent < cfg.Events; {
		due := cfg.Events
		if cfg.Rate > 0 {
			// Event n (from 0) is due at n/Rate seconds.
			due = min(cfg.Events, 1+int(time.Since(start).Seconds()*float64(cfg.Rate)))
			if b := cfg.PublishBatch; b > 1 && due < cfg.Events {
				due -= due % b // whole requests, stamped when they go out
			}
		}
		for ; sent < due; sent++ {
			if sent%ctxCheckEvery == 0 && ctx.Err() != nil {
				return ctx.Err()
			}
			seq := uint64(sent + 1)
			if cfg.viewRun() {
				customer, _ := cfg.docOf(seq)
				subj = cfg.appendDocSubject(subj[:0], seq)
				subject = string(subj)
				buf = appendDocPayload(buf[:0], seq, time.Now().UnixNano(), cfg.Size, customer)
			} else {
				buf = appendPayload(buf[:0], seq, time.Now().UnixNano(), cfg.Size)
			}
			if err := out.send(ctx, subject, buf); err != nil {
				return fmt.Errorf("publish seq %d: %w", sent+1, err)
			}
			if count != nil {
				count.Store(int64(sent + 1))
			}
		}
		if sent < cfg.Events {
			if cfg.Rate > 0 { // paced: what came due goes out now
				if err := out.push(ctx); err != nil {
					return fmt.Errorf("publish: %w", err)
				}
			}
			select {
			case <-tick:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	fctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	if err := out.flush(fctx); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	return nil
}

// sink is where the publisher sends events: NATS (the gateway consumes it,
// or JetStream captures it) or a Redis stream (pipelined XADD).
type sink interface {
	send(ctx context.Context, subject string, payload []byte) error // may buffer; payload is reused after return
	push(ctx context.Context) error                                 // send what is buffered, without waiting
	flush(ctx context.Context) error                                // send everything and wait until the broker has it
	// sendAcked publishes one event after what is buffered, waits for the
	// broker to store it and returns its cursor; a broker that keeps no
	// history for subject fails with ErrNotDurable.
	sendAcked(ctx context.Context, subject string, payload []byte) (cursor string, err error)
	close()
}

// openSink connects the configured broker, or the gateway's publish
// endpoint (PublishBatch).
func openSink(ctx context.Context, cfg *Config) (sink, error) {
	if cfg.PublishBatch > 0 {
		return newHTTPSink(cfg), nil
	}
	if cfg.Broker == "redis" {
		b, err := broker.DialRedis(ctx, broker.RedisConfig{URL: cfg.RedisURL, Stream: cfg.Stream})
		if err != nil {
			return nil, err
		}
		return &redisSink{b: b}, nil
	}
	nc, err := connectNATS(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if cfg.Broker == "jetstream" {
		return newJetStreamSink(nc)
	}
	return natsSink{nc}, nil
}

type natsSink struct{ nc *nats.Conn }

func (s natsSink) send(_ context.Context, subject string, p []byte) error {
	return s.nc.Publish(subject, p) // copies p into its write buffer
}
func (s natsSink) push(context.Context) error { return nil } // the client's flusher sends it
func (s natsSink) flush(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok { // the nats client requires one
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	return s.nc.FlushWithContext(ctx)
}
func (s natsSink) close() { s.nc.Close() }

// sendAcked asks JetStream which stream stores subject first: the
// gateway's own Core NATS subscription would take a plain publish as
// delivered, so without a stream a publish would wait for an ack that
// never comes instead of failing.
func (s natsSink) sendAcked(ctx context.Context, subject string, p []byte) (string, error) {
	js, err := jetstream.New(s.nc)
	if err != nil {
		return "", fmt.Errorf("jetstream: %w", err)
	}
	_, err = js.StreamNameBySubject(ctx, subject)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, nats.ErrNoResponders):
		return "", fmt.Errorf("%w: no JetStream stream stores %q (%w): run the gateway with --broker jetstream and --subjects covering it",
			ErrNotDurable, subject, err)
	case err != nil:
		return "", fmt.Errorf("look up the stream of %q: %w", subject, err)
	}
	ack, err := js.Publish(ctx, subject, p)
	if err != nil {
		return "", fmt.Errorf("publish %q: %w", subject, err)
	}
	return broker.FormatJSCursor(ack.Sequence), nil
}

// redisBatch is how many XADDs go in one pipelined round trip.
const redisBatch = 256

type redisSink struct {
	b   *broker.Redis
	buf []broker.Outgoing
}

func (s *redisSink) send(ctx context.Context, subject string, p []byte) error {
	s.buf = append(s.buf, broker.Outgoing{Subject: subject, Data: bytes.Clone(p)})
	if len(s.buf) >= redisBatch {
		return s.push(ctx)
	}
	return nil
}
func (s *redisSink) push(ctx context.Context) error {
	if len(s.buf) == 0 {
		return nil
	}
	_, err := s.b.Publish(ctx, s.buf)
	s.buf = s.buf[:0]
	return err
}
func (s *redisSink) flush(ctx context.Context) error { return s.push(ctx) } // Publish waits for the replies
func (s *redisSink) close()                          { _ = s.b.Close() }

func (s *redisSink) sendAcked(ctx context.Context, subject string, p []byte) (string, error) {
	if err := s.push(ctx); err != nil {
		return "", err
	}
	cursors, err := s.b.Publish(ctx, []broker.Outgoing{{Subject: subject, Data: bytes.Clone(p)}})
	if err != nil {
		return "", err
	}
	return cursors[0], nil
}
