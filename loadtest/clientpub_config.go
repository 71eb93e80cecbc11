package loadtest

import (
	"fmt"
	"net/url"
	"strings"
)

// Who publishes a run's events (Config.PublishVia).
const (
	PublishViaBroker = "broker" // one publisher, straight into the broker (the default)
	PublishViaWS     = "ws"     // every client, native "publish" messages on its own connection
	PublishViaHTTP   = "http"   // every client, one POST /api/publish per event
)

// clientsPublish reports whether the clients publish (through the gateway)
// rather than one publisher into the broker.
func (c *Config) clientsPublish() bool {
	return c.PublishVia == PublishViaWS || c.PublishVia == PublishViaHTTP
}

// perClient is how many events each client must receive: Events, or
// Clients × Events when every client publishes Events of its own.
func (c *Config) perClient() int64 {
	if c.clientsPublish() {
		return int64(c.Clients) * int64(c.Events)
	}
	return int64(c.Events)
}

// validatePublishVia checks PublishVia and what it cannot be combined with.
func (c *Config) validatePublishVia() error {
	switch {
	case c.PublishVia != PublishViaBroker && !c.clientsPublish():
		return fmt.Errorf("%w: PublishVia %q: want broker, ws or http", ErrInvalidConfig, c.PublishVia)
	case c.PublishBatch < 0:
		return fmt.Errorf("%w: PublishBatch %d is negative", ErrInvalidConfig, c.PublishBatch)
	case c.PublishBatch > 0 && c.clientsPublish():
		return fmt.Errorf("%w: PublishBatch is the one publisher's (PublishVia broker), not PublishVia %s", ErrInvalidConfig, c.PublishVia)
	case c.PublishBatch > 0 && c.HTTPURL == "":
		_, err := publishURL(c.URL)
		return fmt.Errorf("%w: no HTTPURL from URL %q: %w", ErrInvalidConfig, c.URL, err)
	case !c.clientsPublish():
		return nil
	case c.PublishVia == PublishViaWS && c.Proto != ProtoNative:
		return fmt.Errorf("%w: PublishVia ws needs Proto native, not %q", ErrInvalidConfig, c.Proto)
	case c.ResumeShare > 0 || c.Churn > 0:
		return fmt.Errorf("%w: PublishVia %s is a test of its own: drop ResumeShare and Churn", ErrInvalidConfig, c.PublishVia)
	case c.Rate > 0:
		return fmt.Errorf("%w: Rate paces the broker publisher; PublishVia %s publishes as fast as the gateway accepts", ErrInvalidConfig, c.PublishVia)
	case c.PublishVia == PublishViaHTTP && c.HTTPURL == "":
		_, err := publishURL(c.URL)
		return fmt.Errorf("%w: no HTTPURL from URL %q: %w", ErrInvalidConfig, c.URL, err)
	}
	return nil
}

// publishURL derives the HTTP publish endpoint from the native WebSocket
// URL: ws://127.0.0.1:8080/ws → http://127.0.0.1:8080/api/publish.
func publishURL(native string) (string, error) {
	u, err := url.Parse(native)
	if err != nil {
		return "", err
	}
	switch u.Scheme {
	case "ws":
		u.Scheme = "http"
	case "wss":
		u.Scheme = "https"
	}
	switch {
	case u.Path == "" || u.Path == "/":
		u.Path = "/api/publish"
	case strings.HasSuffix(u.Path, "/ws"):
		u.Path = strings.TrimSuffix(u.Path, "/ws") + "/api/publish"
	default:
		return "", fmt.Errorf("path %q does not end in /ws: give the publish endpoint (HTTPURL)", u.Path)
	}
	u.RawPath = ""
	return u.String(), nil
}
