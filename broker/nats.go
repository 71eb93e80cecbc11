package broker

import (
	"cmp"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fanwire/fanwire/redact"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// NATSConfig configures a Core NATS broker.
type NATSConfig struct {
	URL      string         // nats://host:port[,nats://…]; ignored when Server is set
	Server   *server.Server // embedded server to connect to in-process (no socket)
	Subjects []string       // the subject space Consume subscribes to, e.g. ["db.>","app.>"]
	Name     string         // client name shown by the server
	Logger   *zap.Logger
	// OnDrop is called with the number of messages the client library
	// dropped because Consume's buffer was full (a NATS slow consumer).
	OnDrop func(n int)
	// OnState is called when the connection goes up (true) or down (false).
	OnState func(up bool)

	// Credentials and TLS for a secured server (see natsauth.go); none
	// applies to an embedded Server. Each file is read and checked by
	// DialNATS before it dials, and read again at each reconnect (creds
	// and seed) so a rotated file is picked up.
	CredsFile string // a user's JWT and NKey seed (.creds), for NATS accounts
	NKeyFile  string // a user's NKey seed, for a server that lists NKey users
	TLSCA     string // PEM CA bundle the server's certificate must chain to (default: the system's); turns TLS on
	TLSCert   string // PEM client certificate, with TLSKey, for servers that verify clients; turns TLS on
	TLSKey    string
}

// consumeBuffer is the client-side buffer between the NATS read loop and the
// dispatcher: 64 Ki messages absorb a burst of that size while the
// dispatcher is busy; beyond it the library drops and OnDrop counts.
const consumeBuffer = 64 << 10

// maxBatch bounds one handler call so the dispatcher's read lock on the
// subscription index is short.
const maxBatch = 256

// NATS is the Core NATS broker: at-most-once, no history, no cursors.
type NATS struct {
	cfg NATSConfig // static
	nc  *nats.Conn // static after DialNATS
	log *zap.Logger
	// closed is closed by the client library's last callback after Close:
	// its callbacks (the disconnect's log line) run on a goroutine of its
	// own, which Close waits for.
	// Consume returns ErrClosed when it is closed.
	closed  chan struct{}
	closing atomic.Bool // set by Close: the disconnect that follows is ours, not news
	buffer  int         // messages Consume holds for a busy handler (consumeBuffer; tests make it small)

	mu      sync.Mutex
	dropped map[*nats.Subscription]int // guarded by mu: last Dropped() counted per subscription
}

// DialNATS connects to NATS. It keeps reconnecting forever after a loss;
// Ready reports the state meanwhile.
func DialNATS(ctx context.Context, cfg NATSConfig) (*NATS, error) {
	return dialNATS(ctx, cfg)
}

// dialNATS is DialNATS with options of the caller's added.
func dialNATS(ctx context.Context, cfg NATSConfig, extra ...nats.Option) (*NATS, error) {
	if len(cfg.Subjects) == 0 {
		cfg.Subjects = []string{">"}
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	b := &NATS{cfg: cfg, log: log, dropped: make(map[*nats.Subscription]int), closed: make(chan struct{})}
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, time.Second),
		nats.RetryOnFailedConnect(false),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if !b.closing.Load() {
				log.Warn("nats disconnected", zap.Error(err))
			}
			b.state(false)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", zap.String("url", nc.ConnectedUrlRedacted()))
			b.state(true)
		}),
		nats.ErrorHandler(b.asyncError),
		nats.ClosedHandler(func(*nats.Conn) { close(b.closed) }),
	}
	secure, err := cfg.secureOptions()
	if err != nil {
		return nil, err
	}
	opts = append(opts, secure...)
	opts = append(opts, extra...)
	url := cfg.URL
	if cfg.Server != nil {
		opts = append(opts, nats.InProcessServer(cfg.Server))
		url = cfg.Server.ClientURL()
	}
	// nats.Connect takes no context: bound its dial by ctx's deadline.
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w", redact.NATSURL(url), err)
	}
	if dl, ok := ctx.Deadline(); ok {
		opts = append(opts, nats.Timeout(max(time.Until(dl), time.Millisecond)))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w%s", redact.NATSURL(url), redactErr(err, url, true), connectHint(err))
	}
	b.nc = nc
	b.state(true)
	return b, nil
}

func (b *NATS) state(up bool) {
	if b.cfg.OnState != nil {
		b.cfg.OnState(up)
	}
}

// asyncError logs the client library's asynchronous errors. It raises a
// slow consumer once per episode (the first drop after a delivery), not
// per message dropped: Consume counts the drops after each batch.
func (b *NATS) asyncError(_ *nats.Conn, sub *nats.Subscription, err error) {
	if sub == nil || err != nats.ErrSlowConsumer {
		b.log.Warn("nats async error", zap.Error(err))
		return
	}
	n := b.countDropped(sub)
	b.log.Warn("nats slow consumer: messages dropped", zap.String("subject", sub.Subject), zap.Int("dropped", n))
}

// countDropped reports to OnDrop the messages the library dropped on sub
// since the last count, and returns their number.
func (b *NATS) countDropped(sub *nats.Subscription) int {
	d, err := sub.Dropped()
	if err != nil { // unsubscribed: counted when Consume left
		return 0
	}
	b.mu.Lock()
	n := d - b.dropped[sub]
	if n > 0 {
		b.dropped[sub] = d
	}
	b.mu.Unlock()
	if n > 0 && b.cfg.OnDrop != nil {
		b.cfg.OnDrop(n)
	}
	return max(n, 0)
}

// Conn exposes the underlying connection (for the loadtest and tests).
func (b *NATS) Conn() *nats.Conn { return b.nc }

// Publish publishes msgs and flushes, so that when it returns the server has
// them. Core NATS has no history: cursors are empty.
func (b *NATS) Publish(ctx context.Context, msgs []Outgoing) ([]string, error) {
	for _, m := range msgs {
		if err := b.nc.Publish(m.Subject, m.Data); err != nil {
			return nil, fmt.Errorf("publish %q: %w", m.Subject, err)
		}
	}
	if err := b.flush(ctx); err != nil {
		return nil, fmt.Errorf("publish: %w", err)
	}
	return make([]string, len(msgs)), nil
}

// Consume subscribes once to each pattern of the subject space (not once
// per client pattern: overlapping NATS subscriptions would deliver one event
// twice, and one subscription per node keeps the server's interest graph
// small) and delivers batches to h on the calling goroutine. After each
// batch it reports to OnDrop what the library dropped meanwhile.
func (b *NATS) Consume(ctx context.Context, h Handler, started func(start string)) error {
	ch := make(chan *nats.Msg, cmp.Or(b.buffer, consumeBuffer))
	var subs []*nats.Subscription
	defer func() {
		for _, s := range subs {
			b.countDropped(s)
			_ = s.Unsubscribe()
			b.mu.Lock()
			delete(b.dropped, s)
			b.mu.Unlock()
		}
	}()
	for _, subj := range b.cfg.Subjects {
		s, err := b.nc.ChanSubscribe(subj, ch)
		if err != nil {
			return fmt.Errorf("subscribe %q: %w", subj, err)
		}
		subs = append(subs, s)
	}
	if err := b.flush(ctx); err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	if b.nc.IsClosed() {
		return ErrClosed
	}
	if started != nil {
		started("")
	}
	batch := make([]Message, 0, maxBatch)
	for {
		var m *nats.Msg
		select {
		case m = <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-b.closed:
			return ErrClosed
		}
		if isBusSubject(m.Subject) { // the nodes' own bus (bus.go), which ">" matches
			continue
		}
		arrived := time.Now()
		batch = append(batch[:0], Message{Subject: m.Subject, Data: m.Data})
	fill:
		for len(batch) < maxBatch {
			select {
			case m = <-ch:
				if !isBusSubject(m.Subject) {
					batch = append(batch, Message{Subject: m.Subject, Data: m.Data})
				}
			default:
				break fill
			}
		}
		h(batch, arrived)
		clear(batch)
		for _, s := range subs {
			b.countDropped(s)
		}
	}
}

// flushTimeout bounds a flush round-trip when ctx has no deadline of its own
// (the nats client requires one).
const flushTimeout = 10 * time.Second

func (b *NATS) flush(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, flushTimeout)
		defer cancel()
	}
	if err := b.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	return nil
}

// Ready reports whether the connection is up.
func (b *NATS) Ready() bool { return b.nc.IsConnected() }

// Name returns "nats".
func (b *NATS) Name() string { return "nats" }

// Close drains nothing: the ws role does not own messages in flight (Core
// NATS is at-most-once). It closes the connection and waits (up to 5 s)
// for the client library's callbacks to have run.
func (b *NATS) Close() error {
	b.closing.Store(true)
	b.nc.Close()
	select { // the library runs the closed callback after every earlier one
	case <-b.closed:
	case <-time.After(5 * time.Second):
	}
	return nil
}
