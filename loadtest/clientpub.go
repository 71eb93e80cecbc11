package loadtest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// publishClients makes every client publish its own events
// (Config.PublishVia ws or http): client i publishes i×Events+1 ..
// (i+1)×Events, one after another, each stamped with its publish time. It
// starts one goroutine per client and returns when all have sent every
// event (ws: written to the connection; the gateway's "published" replies
// are counted by the readers) or had every one accepted (http), with the
// first error.
func publishClients(ctx context.Context, cfg *Config, clients []*client) error {
	var tr *http.Transport
	if cfg.PublishVia == PublishViaHTTP {
		// One keep-alive connection per client: each publishes one
		// request after another, as each ws client on its connection.
		tr = &http.Transport{MaxIdleConnsPerHost: len(clients), DialContext: netDialer(cfg).DialContext}
		defer tr.CloseIdleConnections() // no idle connection (and its goroutines) outlives the run
	}
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			if tr != nil {
				errs[i] = c.publishHTTP(ctx, cfg, &http.Client{Transport: tr, Timeout: cfg.Timeout})
			} else {
				errs[i] = c.publishWS(ctx, cfg)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// firstSeq is the sequence number before client c's first event.
func (c *client) firstSeq(cfg *Config) uint64 { return uint64(c.id) * uint64(cfg.Events) }

// publishWS writes c's events as native publish messages, one per
// WebSocket message. coder/websocket allows one writer beside the reader;
// this goroutine is the connection's only writer while it runs.
func (c *client) publishWS(ctx context.Context, cfg *Config) error {
	nc, ok := c.conn.(*nativeConn)
	if !ok {
		return fmt.Errorf("client %d: publish via ws needs a native connection", c.id)
	}
	return c.publishEach(cfg, `{"type":"publish","id":"p","subject":`, func(body []byte) error {
		return nc.Write(ctx, websocket.MessageText, body)
	})
}

// publishHTTP posts c's events to cfg.HTTPURL, one request each, and counts
// each 200 answer as accepted.
func (c *client) publishHTTP(ctx context.Context, cfg *Config, hc *http.Client) error {
	return c.publishEach(cfg, `{"subject":`, func(body []byte) error {
		if err := postEvent(ctx, hc, cfg.HTTPURL, body); err != nil {
			return err
		}
		c.acked.Add(1)
		c.lastAcked.Store(time.Now().UnixNano())
		return nil
	})
}

// publishEach sends c's events one at a time with send, each a JSON object
// that starts with prefix, then the subject, then the data: its payload.
func (c *client) publishEach(cfg *Config, prefix string, send func(body []byte) error) error {
	head := []byte(prefix + quoteSubject(cfg.Subject) + `,"data":`)
	buf := make([]byte, 0, len(head)+cfg.Size+64)
	base := c.firstSeq(cfg)
	for n := 1; n <= cfg.Events; n++ {
		buf = append(buf[:0], head...)
		buf = appendPayload(buf, base+uint64(n), time.Now().UnixNano(), cfg.Size)
		buf = append(buf, '}')
		if err := send(buf); err != nil {
			return fmt.Errorf("client %d: publish seq %d: %w", c.id, base+uint64(n), err)
		}
	}
	return nil
}

// postEvent posts one event and drains the answer, so the connection is
// reused; anything but 200 is an error carrying the answer.
func postEvent(ctx context.Context, hc *http.Client, url string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: POST %s: %s: %s", ErrPublishRefused, url, resp.Status, bytes.TrimSpace(answer))
	}
	return nil
}

// quoteSubject is subject as a JSON string.
func quoteSubject(s string) string {
	b, _ := json.Marshal(s) // a string always encodes
	return string(b)
}
