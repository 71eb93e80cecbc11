package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"go.uber.org/zap"
)

// Client publishes: a native client's {"type":"publish"} message and the
// GraphQL publish mutation, each with the connection's grants (publishauth.go).
//
// A publish runs on the connection's reader, which reads the next message
// only once the broker has the event (or refused it) and the reply is
// queued. That keeps one connection's publishes in order and makes the
// broker's pace the client's: a client publishing faster than the broker
// takes its events waits in TCP, with nothing queued in the gateway for it.
// Every publish message is a client message like any other: it counts
// against MaxMessageRate (over it: rate_limited, with its id) before it is
// parsed. The reply (published, or an error) goes through the connection's
// mailbox in order with its events; there is no order between the reply
// and the delivery of the event itself to the connection's own matching
// subscriptions, which comes through the broker like any other event.

// clientPublishTimeout bounds one client publish's broker round trip. The
// reader does not read while it waits, so pongs wait too: half the ping
// timeout keeps a publish stuck on a failing broker from cutting the
// connection with a ping timeout.
func (s *Server) clientPublishTimeout() time.Duration {
	return min(publishTimeout, s.cfg.PingTimeout/2)
}

// maxPublishData is the largest data a client publish may carry: the
// smaller of MaxPublishBytes and the broker's message limit, less the
// subject.
func (s *Server) maxPublishData(subject string) int64 {
	n := s.cfg.MaxPublishBytes
	if l, ok := s.cfg.Broker.(broker.Limited); ok {
		n = min(n, int64(l.MaxMessage()-len(subject)))
	}
	return n
}

// overMailbox says why an event on subject with compacted data of n bytes
// is refused, or "" when it fits in an empty mailbox: a bigger one could
// be delivered to no one (it would overflow every subscriber's mailbox;
// from the broker, it is dropped: see Server.dispatch).
func (s *Server) overMailbox(subject string, n int) string {
	if size := fanout.EventSize(subject, "", n); size > s.cfg.MailboxBytes { // no cursor yet
		return fmt.Sprintf("event on %q of %d bytes: over the %d bytes of a connection's queue (--mailbox-bytes), no subscriber could receive it", subject, size, s.cfg.MailboxBytes)
	}
	return ""
}

// clientPublish checks and publishes one event for a connection's
// publisher; it returns the event's cursor or the refusal.
func (s *Server) clientPublish(ctx context.Context, pub publisher, allowed bool, subject string, data []byte) (string, *publishRefusal) {
	if !allowed {
		return "", &publishRefusal{CodeForbidden, ruleNoPublish, "this connection may not publish: it was admitted without a token, and anonymous publishing is off (--allow-anonymous-publish)"}
	}
	if ref := s.checkPublish(pub, subject); ref != nil {
		return "", ref
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, data); err != nil {
		return "", &publishRefusal{CodeBadFrame, "", "\"data\": " + jsonErrorText(err)}
	}
	if max := s.maxPublishData(subject); int64(buf.Len()) > max {
		return "", &publishRefusal{CodeTooLarge, ruleSize, fmt.Sprintf("data of %d bytes: over the %d bytes a publish may carry", buf.Len(), max)}
	}
	if msg := s.overMailbox(subject, buf.Len()); msg != "" {
		return "", &publishRefusal{CodeTooLarge, ruleMailbox, msg}
	}
	if !s.cfg.Broker.Ready() {
		return "", &publishRefusal{CodeBrokerUnavailable, "", "the broker is disconnected: retry"}
	}
	ctx, cancel := context.WithTimeout(ctx, s.clientPublishTimeout())
	defer cancel()
	cursors, err := s.cfg.Broker.Publish(ctx, []broker.Outgoing{{Subject: subject, Data: buf.Bytes()}})
	if err != nil {
		s.log.Warn("client publish failed", zap.Error(err), zap.String("subject", subject))
		return "", &publishRefusal{CodeBrokerUnavailable, "", "broker: " + err.Error()}
	}
	s.metrics.PublishedEvents.Inc()
	var cursor string
	if len(cursors) == 1 {
		cursor = cursors[0]
	}
	return cursor, nil
}

// publish runs a native publish message on the reader.
func (c *conn) publish(id, subject string, data json.RawMessage) {
	pub, allowed := c.s.grantsPublisher(c.grants)
	cursor, ref := c.s.clientPublish(c.runCtx, pub, allowed, subject, data)
	if ref != nil {
		c.clientError(id, ref.code, ref.msg)
		return
	}
	c.send(publishedMessage(id, cursor))
}
