package loadtest

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/nats-io/nats.go"
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
		return nil, fmt.Errorf("connect nats %s: %w", cfg.NATSURL, err)
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

// publish sends events 1..cfg.Events to cfg.Subject, each stamped with its
// publish time, and returns once the server has them all (a flush round trip).
// With cfg.Rate > 0 it wakes every paceInterval and publishes the events that
// have come due, so the average rate is exact and batches stay small (Rate/1000).
func publish(ctx context.Context, nc *nats.Conn, cfg *Config) error {
	buf := make([]byte, 0, cfg.Size+64) // nats copies the payload into its own buffer, so one will do
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
		}
		for ; sent < due; sent++ {
			if sent%ctxCheckEvery == 0 && ctx.Err() != nil {
				return ctx.Err()
			}
			buf = appendPayload(buf[:0], uint64(sent+1), time.Now().UnixNano(), cfg.Size)
			if err := nc.Publish(cfg.Subject, buf); err != nil {
				return fmt.Errorf("publish seq %d: %w", sent+1, err)
			}
		}
		if sent < cfg.Events {
			select {
			case <-tick:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	fctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	if err := nc.FlushWithContext(fctx); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	return nil
}
