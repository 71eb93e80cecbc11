package loadtest

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// jsWindow bounds the publishes awaiting their ack: the client stalls, then
// fails, past its own limit (4,000).
const jsWindow = 2048

// jetStreamSink publishes with JetStream acks (async, windowed): an event
// counts as published once the stream has stored it, so a measurement that
// starts after flush (the catch-up of --resume-behind) does not also time
// the stream storing what was just sent.
type jetStreamSink struct {
	natsSink
	js jetstream.JetStream

	mu  sync.Mutex
	err error // first failed publish, reported by send and flush
}

func newJetStreamSink(nc *nats.Conn) (*jetStreamSink, error) {
	s := &jetStreamSink{natsSink: natsSink{nc}}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(2*jsWindow),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) {
			s.mu.Lock()
			if s.err == nil {
				s.err = fmt.Errorf("jetstream publish %s: %w", m.Subject, err)
			}
			s.mu.Unlock()
		}))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	s.js = js
	return s, nil
}

func (s *jetStreamSink) failed() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *jetStreamSink) send(ctx context.Context, subject string, p []byte) error {
	if s.js.PublishAsyncPending() >= jsWindow {
		if err := s.flush(ctx); err != nil {
			return err
		}
	}
	// The library keeps the message until its ack (to re-send it): it
	// must not share the caller's buffer.
	if _, err := s.js.PublishAsync(subject, bytes.Clone(p)); err != nil {
		return err
	}
	return s.failed()
}

func (s *jetStreamSink) push(context.Context) error { return s.failed() }

// flush waits until every publish is acknowledged.
func (s *jetStreamSink) flush(ctx context.Context) error {
	select {
	case <-s.js.PublishAsyncComplete():
	case <-ctx.Done():
		return fmt.Errorf("waiting for jetstream acks: %w", ctx.Err())
	}
	return s.failed()
}

// sendAcked publishes after every pending publish is acknowledged, so the
// cursor it returns is after theirs.
func (s *jetStreamSink) sendAcked(ctx context.Context, subject string, p []byte) (string, error) {
	if err := s.flush(ctx); err != nil {
		return "", err
	}
	return s.natsSink.sendAcked(ctx, subject, p)
}
