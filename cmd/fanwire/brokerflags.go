package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/nats-io/nats-server/v2/server"
	"go.uber.org/zap"
)

// brokerFlags choose and configure the broker; the ws and ingest roles
// (and dev) share them.
type brokerFlags struct {
	brokerKind       string
	natsURL          string
	subjects         listFlag
	stream           string
	retentionAge     time.Duration
	retentionBytes   int64
	storage          string
	replicas         int
	redisURL         string
	redisCluster     bool
	redisMaxLen      int64
	redisDedupWindow time.Duration
	dedupWindow      time.Duration
	natsCreds        string
	natsNKey         string
	natsTLSCA        string
	natsTLSCert      string
	natsTLSKey       string
	redisTLSCA       string
	redisTLSCert     string
	redisTLSKey      string
}

// register adds the broker flags; embedded (dev) has no --nats-url and
// defaults to JetStream on its embedded server, and subjects is the
// default subject space.
func (f *brokerFlags) register(fs *flag.FlagSet, embedded bool, subjects string) {
	if !embedded {
		fs.StringVar(&f.natsURL, "nats-url", "nats://127.0.0.1:4222", "NATS server URL(s), comma-separated; tls:// for TLS (user:password@ for a server with users)")
		fs.StringVar(&f.natsCreds, "nats-creds", "", "nats and jetstream: a user's credentials file (JWT and NKey seed, .creds) for a server with accounts; read at start and at each reconnect")
		fs.StringVar(&f.natsNKey, "nats-nkey", "", "nats and jetstream: a user's NKey seed file, for a server that lists NKey users")
		fs.StringVar(&f.natsTLSCA, "nats-tls-ca", "", "nats and jetstream: PEM file of the CA(s) that issued the server's certificate (default: the system's); turns TLS on")
		fs.StringVar(&f.natsTLSCert, "nats-tls-cert", "", "nats and jetstream: PEM client certificate, with --nats-tls-key, for a server that verifies clients; turns TLS on")
		fs.StringVar(&f.natsTLSKey, "nats-tls-key", "", "nats and jetstream: PEM key of --nats-tls-cert")
	}
	if embedded {
		fs.StringVar(&f.brokerKind, "broker", "jetstream", "jetstream (a stream on the embedded server, stored in --data-dir: events carry cursors, clients subscribe from the first or resume, views start from the newest), nats (Core NATS: live only, no cursors) or redis (durable, on --redis-url)")
	} else {
		fs.StringVar(&f.brokerKind, "broker", "nats", "nats (Core NATS: live only, no cursors), jetstream or redis (durable: events carry cursors, clients resume)")
	}
	fs.StringVar(&f.redisURL, "redis-url", "redis://127.0.0.1:6379", "redis: server URL; with --redis-cluster a seed node, more as addr parameters (redis://a:6379?addr=b:6379&addr=c:6379)")
	fs.StringVar(&f.redisTLSCA, "redis-tls-ca", "", "redis: PEM file of the CA(s) that issued the server's certificate, for a rediss:// URL (default: the system's)")
	fs.StringVar(&f.redisTLSCert, "redis-tls-cert", "", "redis: PEM client certificate, with --redis-tls-key, for a server with tls-auth-clients (rediss:// URL)")
	fs.StringVar(&f.redisTLSKey, "redis-tls-key", "", "redis: PEM key of --redis-tls-cert")
	fs.BoolVar(&f.redisCluster, "redis-cluster", false, "redis: --redis-url is a Redis Cluster: follow its slot map and MOVED/ASK redirections (--stream must then hold a hash tag, e.g. {fanwire})")
	fs.Int64Var(&f.redisMaxLen, "redis-maxlen", 1_000_000, "redis: keep about this many events in the stream (XADD MAXLEN ~; 0: no limit)")
	fs.DurationVar(&f.dedupWindow, "dedup-window", broker.DefaultRedisDedupWindow, "jetstream and redis: how long a publish \"id\" is remembered: a repeat within it is not stored again and gets the original cursor (jetstream: the stream's duplicate window, never lowered below what an operator set)")
	fs.DurationVar(&f.redisDedupWindow, "redis-dedup-window", 0, "deprecated: --dedup-window (when set, it wins for redis)")
	fs.StringVar(&f.stream, "stream", "FANWIRE", "jetstream: the stream that captures --subjects (created or updated at start); redis: the stream key (with --redis-cluster it must hold a hash tag, e.g. {fanwire})")
	fs.DurationVar(&f.retentionAge, "retention-age", 24*time.Hour, "jetstream: keep events this long (0: no age limit)")
	fs.Int64Var(&f.retentionBytes, "retention-bytes", 1<<30, "jetstream: keep at most this many bytes of events (0: no size limit)")
	fs.StringVar(&f.storage, "storage", "file", "jetstream: file or memory")
	fs.IntVar(&f.replicas, "replicas", 0, "jetstream: the stream's replicas, 3 on a NATS cluster (0: an existing stream keeps its own, a new one gets 1)")
	f.subjects = listFlag(strings.Split(subjects, ","))
	if embedded {
		fs.Var(&f.subjects, "subjects", "the subject space, comma-separated NATS patterns that must not overlap: with jetstream the stream keeps these (a stream over > is refused), by default the ingest's <--prefix>.> and "+strings.Join(devAppSpaces, ",")+"; with nats or redis, by default >. With --pg, <--prefix>.> is added to a given list that does not cover it")
	} else {
		fs.Var(&f.subjects, "subjects", "the subject space, comma-separated NATS patterns (e.g. db.>,app.>); patterns must not overlap; jetstream needs one narrower than >")
	}
}

// dial connects the chosen broker (to ns when embedded). drop counts
// events lost before delivery, by reason.
func (f *brokerFlags) dial(ctx context.Context, log *zap.Logger, ns *server.Server, name string, drop func(reason string, n int)) (broker.Broker, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ncfg := broker.NATSConfig{
		URL:      f.natsURL,
		Server:   ns,
		Subjects: f.subjects,
		Name:     name,
		Logger:   log.Named("nats"),
		OnDrop:   func(n int) { drop("broker_slow_consumer", n) },

		CredsFile: f.natsCreds,
		NKeyFile:  f.natsNKey,
		TLSCA:     f.natsTLSCA,
		TLSCert:   f.natsTLSCert,
		TLSKey:    f.natsTLSKey,
	}
	switch f.brokerKind {
	case "nats":
		return broker.DialNATS(ctx, ncfg)
	case "jetstream":
		return broker.DialJetStream(ctx, broker.JetStreamConfig{
			NATSConfig: ncfg,
			Stream:     f.stream,
			MaxAge:     f.retentionAge,
			MaxBytes:   f.retentionBytes,
			Storage:    f.storage,
			Replicas:   f.replicas,
			Duplicates: f.dedupWindow,
			OnGap:      func(n int) { drop("removed_before_read", n) },
		})
	case "redis":
		dedup := f.dedupWindow
		if f.redisDedupWindow != 0 {
			dedup = f.redisDedupWindow
		}
		return broker.DialRedis(ctx, broker.RedisConfig{URL: f.redisURL, Cluster: f.redisCluster, Stream: f.stream, MaxLen: f.redisMaxLen,
			DedupWindow: dedup, TLSCA: f.redisTLSCA, TLSCert: f.redisTLSCert, TLSKey: f.redisTLSKey, Logger: log.Named("redis")})
	}
	return nil, fmt.Errorf("--broker %q: want nats, jetstream or redis", f.brokerKind)
}
