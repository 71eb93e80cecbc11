package loadtest

import (
	"context"
	"fmt"
	"net/http"
)

// httpSink posts the publisher's events to the gateway's POST /api/publish
// (Config.PublishBatch): each request is a JSON array of PublishBatch
// events, sent as soon as it is full (push and flush send a shorter last
// one). A request is sent synchronously: the next waits for its answer.
type httpSink struct {
	url   string
	batch int
	hc    *http.Client
	tr    *http.Transport
	body  []byte // the request being built: '[' and the events so far
	n     int    // events in body
}

func newHTTPSink(cfg *Config) *httpSink {
	tr := &http.Transport{DialContext: netDialer(cfg).DialContext}
	return &httpSink{url: cfg.HTTPURL, batch: cfg.PublishBatch, tr: tr, hc: &http.Client{Transport: tr, Timeout: cfg.Timeout}}
}

func (s *httpSink) send(ctx context.Context, subject string, p []byte) error {
	if s.n == 0 {
		s.body = append(s.body[:0], '[')
	} else {
		s.body = append(s.body, ',')
	}
	s.body = append(s.body, `{"subject":`...)
	s.body = append(s.body, quoteSubject(subject)...)
	s.body = append(s.body, `,"data":`...)
	s.body = append(s.body, p...)
	s.body = append(s.body, '}')
	s.n++
	if s.n == s.batch {
		return s.post(ctx)
	}
	return nil
}

// post sends the request built so far, if any.
func (s *httpSink) post(ctx context.Context) error {
	if s.n == 0 {
		return nil
	}
	s.body = append(s.body, ']')
	n := s.n
	s.n = 0
	if err := postEvent(ctx, s.hc, s.url, s.body); err != nil {
		return fmt.Errorf("%d events: %w", n, err)
	}
	return nil
}

func (s *httpSink) push(ctx context.Context) error  { return s.post(ctx) }
func (s *httpSink) flush(ctx context.Context) error { return s.post(ctx) }

func (s *httpSink) sendAcked(context.Context, string, []byte) (string, error) {
	return "", fmt.Errorf("%w: PublishBatch publishes through the gateway, which returns no cursor here", ErrNotDurable)
}

func (s *httpSink) close() { s.tr.CloseIdleConnections() }
