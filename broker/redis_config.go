package broker

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fanwire/fanwire/redact"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// RedisConfig configures the Redis Streams broker.
type RedisConfig struct {
	// URL is the server: redis://[user:pass@]host:port[/db], or rediss://
	// for TLS (go-redis parses both, and the ACL user and password). With Cluster
	// it is a seed node of the cluster, and more seeds may follow as addr
	// parameters (redis://a:6379?addr=b:6379&addr=c:6379): the client
	// learns the slot map from whichever answers. (A separate switch rather
	// than a URL scheme of our own: go-redis parses both forms from the
	// same redis:// URL, and a cluster node cannot be told from a single
	// server by its address.)
	URL string
	// Cluster talks to a Redis Cluster: commands go to the primary owning
	// the stream's slot, and MOVED/ASK redirections (a failover, a
	// resharding) are followed. Stream must then hold a hash tag.
	Cluster bool
	// Stream is the stream key (default "fanwire"). On Redis Cluster it
	// must hold a hash tag, e.g. "{fanwire}": the publish-id dedup keys
	// start with the stream key, and the dedup script touches both, which
	// Redis Cluster allows only for keys of one slot.
	Stream string
	MaxLen int64 // approximate trimming (XADD MAXLEN ~); 0 keeps everything
	// DedupWindow is how long a publish id is remembered: a message with
	// the same Outgoing.ID within it is not appended again and gets the
	// original cursor, as on JetStream (whose stream window is also 2
	// minutes by default). Default 2m.
	DedupWindow time.Duration
	// TLS files for a rediss:// URL (see redisTLS); each is read before
	// anything dials.
	TLSCA   string // PEM CA bundle the server's certificate must chain to (default: the system's)
	TLSCert string // PEM client certificate, with TLSKey, for a server with tls-auth-clients
	TLSKey  string
	Logger  *zap.Logger
}

// DefaultRedisDedupWindow is RedisConfig.DedupWindow's default: JetStream's.
const DefaultRedisDedupWindow = 2 * time.Minute

// withDefaults fills in defaults and validates, naming the field at fault.
func (cfg RedisConfig) withDefaults() (RedisConfig, error) {
	if cfg.Stream == "" {
		cfg.Stream = "fanwire"
	}
	if cfg.DedupWindow == 0 {
		cfg.DedupWindow = DefaultRedisDedupWindow
	}
	if cfg.DedupWindow < time.Millisecond { // SET PX counts whole milliseconds, at least 1
		return cfg, fmt.Errorf("redis: DedupWindow %v: want at least 1ms", cfg.DedupWindow)
	}
	if _, ok := hashTag(cfg.Stream); cfg.Cluster && !ok {
		return cfg, fmt.Errorf("redis: Stream %q has no hash tag: on Redis Cluster the stream and its publish-id keys must share a slot, "+
			"so name it with one, e.g. %q (--stream)", cfg.Stream, "{"+cfg.Stream+"}")
	}
	return cfg, nil
}

// hashTag returns what Redis Cluster hashes of key instead of all of it:
// the text between the first '{' and the next '}', when that is not empty.
// Every key that starts with the stream key (its dedup keys) then has the
// stream's tag, whatever follows.
func hashTag(key string) (string, bool) {
	_, rest, ok := strings.Cut(key, "{")
	if !ok {
		return "", false
	}
	tag, _, ok := strings.Cut(rest, "}")
	return tag, ok && tag != ""
}

// dial builds the client and checks that the server which will hold the
// stream answers.
func (cfg RedisConfig) dial(ctx context.Context) (redis.UniversalClient, error) {
	if !cfg.Cluster {
		opts, err := redis.ParseURL(cfg.URL)
		if err != nil {
			return nil, fmt.Errorf("redis: url %q (--redis-url): %w", redact.URL(cfg.URL), redactErr(err, cfg.URL, false))
		}
		if err := cfg.redisTLS(opts.TLSConfig); err != nil {
			return nil, err
		}
		rdb := redis.NewClient(opts)
		if err := rdb.Ping(ctx).Err(); err != nil {
			rdb.Close()
			return nil, fmt.Errorf("redis: connect to %s: %w%s", opts.Addr, err, redisHint(err))
		}
		// A single-node client on a cluster node works until the stream's
		// slot is elsewhere, then fails every command with MOVED: refuse
		// it now, saying what to set. (Best effort: a user whose ACL
		// denies INFO is not refused for it.)
		info, err := rdb.Info(ctx, "cluster").Result()
		if err == nil && strings.Contains(info, "cluster_enabled:1") {
			rdb.Close()
			return nil, fmt.Errorf("redis: %s is a Redis Cluster node: set Cluster (--redis-cluster) and give Stream a hash tag", opts.Addr)
		}
		if err := checkRedisVersion(ctx, rdb, opts.Addr); err != nil {
			rdb.Close()
			return nil, err
		}
		return rdb, nil
	}
	opts, err := redis.ParseClusterURL(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("redis: cluster url %q (--redis-url): %w", redact.URL(cfg.URL), redactErr(err, cfg.URL, false))
	}
	if err := cfg.redisTLS(opts.TLSConfig); err != nil {
		return nil, err
	}
	// Every command goes to the primary: replicas lag (replication is
	// asynchronous), and a replica's view would call a cursor just
	// published "ahead of the stream" or miss the newest events.
	opts.ReadOnly, opts.RouteByLatency, opts.RouteRandomly = false, false, false
	rdb := redis.NewClusterClient(opts)
	primary, err := rdb.MasterForKey(ctx, cfg.Stream)
	if err == nil {
		err = primary.Ping(ctx).Err()
	}
	if err != nil {
		rdb.Close()
		return nil, fmt.Errorf("redis: cluster at %s, primary of %q: %w%s", strings.Join(opts.Addrs, ","), cfg.Stream, err, redisHint(err))
	}
	if err := checkRedisVersion(ctx, primary, primary.Options().Addr); err != nil {
		rdb.Close()
		return nil, err
	}
	return rdb, nil
}

// minRedis is the oldest Redis fanwire runs on: Replay tells an expired
// cursor from XINFO STREAM's entries-added and max-deleted-entry-id, which
// Redis 7.0 added (on 6.2 a cursor older than the retained history would
// replay from the oldest retained event, silently skipping the rest).
const minRedis = "7.0"

// checkRedisVersion refuses a server older than minRedis, by the
// redis_version its INFO reports. Best effort, as the cluster check: a
// user whose ACL denies INFO, or a server that does not report a version,
// is not refused for it.
func checkRedisVersion(ctx context.Context, c *redis.Client, addr string) error {
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return nil
	}
	if v, old := redisTooOld(info); old {
		return fmt.Errorf("redis: %s runs Redis %s: fanwire needs Redis %s or newer (see Supported versions in README.md)", addr, v, minRedis)
	}
	return nil
}

// redisTooOld reads redis_version from an INFO answer and reports whether
// it is older than 7.0.
func redisTooOld(info string) (version string, old bool) {
	for line := range strings.Lines(info) {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:")
		if !ok {
			continue
		}
		major, _, _ := strings.Cut(v, ".")
		n, err := strconv.Atoi(major)
		return v, err == nil && n < 7
	}
	return "", false
}
