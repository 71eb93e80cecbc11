package broker_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/redis/go-redis/v9"
)

// narrowACL is a Redis ACL with only what fanwire needs on stream "fw".
var narrowACL = append(slices.Clip(narrowACLBefore37), "+hlen", "+xlen")

// narrowACLBefore37 is the narrow ACL fanwire documented before the
// appends pruned the index (issue 37): without HLEN and XLEN, which the
// prune needs.
var narrowACLBefore37 = []string{"~fw", "~fw:*", "resetchannels", "-@all", "+ping", "+hello",
	"+xadd", "+xread", "+xrange", "+xrevrange", "+xinfo|stream", "+eval", "+evalsha", "+get", "+set", "+hget", "+hset", "+hscan", "+hdel"}

// TestRedisNarrowACLPrunes appends 3,000 subjects, 100 per call, into a
// stream trimmed to about 100 entries, as a user with the narrow ACL
// docs/operations.md lists: the appends prune the index. With the ACL
// documented before the prune, every append still succeeds (the prune
// stops at its first refused command), and the index keeps its fields.
func TestRedisNarrowACLPrunes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		rules []string
		prune bool
	}{
		{"documented", narrowACL, true},
		{"before issue 37", narrowACLBefore37, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := brokertest.RedisSecure(t, brokertest.SecureRedisConfig{User: "fanwire", UserPassword: "pa55", UserRules: tc.rules})
			b, err := dialRedisSecure(broker.RedisConfig{URL: "redis://fanwire:pa55@" + s.Addr, Stream: "fw", MaxLen: 100})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = b.Close() })
			for call := range 30 {
				out := make([]broker.Outgoing, 100)
				for i := range out {
					out[i] = broker.Outgoing{Subject: fmt.Sprintf("app.t.%d", call*100+i), Data: []byte(`{}`)}
				}
				if call%2 == 0 {
					appendAs(t, b, "w", out)
				} else {
					publish(t, b, out)
				}
			}
			raw := redis.NewClient(&redis.Options{Addr: s.Addr, Username: "default"})
			t.Cleanup(func() { _ = raw.Close() })
			hlen, xlen := raw.HLen(t.Context(), "fw:latest").Val(), raw.XLen(t.Context(), "fw").Val()
			if pruned := hlen <= 2*xlen; pruned != tc.prune || xlen == 0 {
				t.Fatalf("the index holds %d fields for a stream of %d entries: want it pruned %v", hlen, xlen, tc.prune)
			}
		})
	}
}

func dialRedisSecure(cfg broker.RedisConfig) (*broker.Redis, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return broker.DialRedis(ctx, cfg)
}

// TestRedisSecured: a real redis-server with a password (requirepass), an
// ACL user, TLS with a CA the test made, and TLS with client
// certificates; each carries an event.
func TestRedisSecured(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	ca := brokertest.NewCA(t)
	for _, tc := range []struct {
		name string
		sec  brokertest.SecureRedisConfig
		cfg  func(s brokertest.SecureRedis) broker.RedisConfig
	}{
		{"requirepass", brokertest.SecureRedisConfig{Password: "s3cret"}, func(s brokertest.SecureRedis) broker.RedisConfig {
			return broker.RedisConfig{URL: "redis://:s3cret@" + s.Addr}
		}},
		{"acl user", brokertest.SecureRedisConfig{User: "fanwire", UserPassword: "pa55"}, func(s brokertest.SecureRedis) broker.RedisConfig {
			return broker.RedisConfig{URL: "redis://fanwire:pa55@" + s.Addr}
		}},
		// The commands docs/operations.md lists for a narrow ACL, on the
		// stream's keys only.
		{"narrow acl user", brokertest.SecureRedisConfig{User: "fanwire", UserPassword: "pa55", UserRules: narrowACL}, func(s brokertest.SecureRedis) broker.RedisConfig {
			return broker.RedisConfig{URL: "redis://fanwire:pa55@" + s.Addr, Stream: "fw"}
		}},
		{"tls+requirepass", brokertest.SecureRedisConfig{CA: ca, Password: "s3cret"}, func(s brokertest.SecureRedis) broker.RedisConfig {
			return broker.RedisConfig{URL: "rediss://:s3cret@" + s.Addr, TLSCA: ca.File}
		}},
		{"mtls+acl user", brokertest.SecureRedisConfig{CA: ca, VerifyClients: true, User: "fanwire", UserPassword: "pa55"}, func(s brokertest.SecureRedis) broker.RedisConfig {
			return broker.RedisConfig{URL: "rediss://fanwire:pa55@" + s.Addr, TLSCA: ca.File, TLSCert: s.ClientCert, TLSKey: s.ClientKey}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := dialRedisSecure(tc.cfg(brokertest.RedisSecure(t, tc.sec)))
			if err != nil {
				t.Fatal(err)
			}
			roundTrip(t, b)
			// A live view's snapshot reads the index of each subject's
			// newest entry (HSCAN; HDEL of trimmed ones).
			n := 0
			if _, err := b.Latest(context.Background(), nil, 0, func(ms []broker.Message) error { n += len(ms); return nil }); err != nil || n == 0 {
				t.Fatalf("Latest: %d messages, %v", n, err)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestRedisSecuredRefusals: wrong or missing credentials and an untrusted
// certificate are errors saying where to look; TLS files with a redis://
// URL, or missing, fail before dialling; no error shows the password.
func TestRedisSecuredRefusals(t *testing.T) {
	t.Parallel()
	ca := brokertest.NewCA(t)
	s := brokertest.RedisSecure(t, brokertest.SecureRedisConfig{CA: ca, User: "fanwire", UserPassword: "pa55"})
	missing := filepath.Join(t.TempDir(), "missing")
	for _, tc := range []struct {
		name string
		cfg  broker.RedisConfig
		want []string
	}{
		{"wrong password", broker.RedisConfig{URL: "rediss://fanwire:wrong@" + s.Addr, TLSCA: ca.File}, []string{"WRONGPASS", "--redis-url"}},
		{"unknown user", broker.RedisConfig{URL: "rediss://nobody:wrong@" + s.Addr, TLSCA: ca.File}, []string{"WRONGPASS", "--redis-url"}},
		{"untrusted certificate", broker.RedisConfig{URL: "rediss://fanwire:pa55@" + s.Addr, TLSCA: brokertest.NewCA(t).File}, []string{"certificate", "--redis-tls-ca"}},
		{"system roots", broker.RedisConfig{URL: "rediss://fanwire:pa55@" + s.Addr}, []string{"certificate", "--redis-tls-ca"}},
		{"tls files with redis://", broker.RedisConfig{URL: "redis://fanwire:pa55@" + s.Addr, TLSCA: ca.File}, []string{"--redis-tls-ca", "rediss://"}},
		{"ca missing", broker.RedisConfig{URL: "rediss://fanwire:pa55@" + s.Addr, TLSCA: missing}, []string{"--redis-tls-ca", missing}},
		{"cert without key", broker.RedisConfig{URL: "rediss://fanwire:pa55@" + s.Addr, TLSCA: ca.File, TLSCert: s.ClientCert}, []string{"--redis-tls-cert", "--redis-tls-key", "both"}},
		{"bad url", broker.RedisConfig{URL: "rediss://fanwire:pa55@" + s.Addr + "/notadb"}, []string{"redis: url", "xxxxx"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := dialRedisSecure(tc.cfg)
			if err == nil {
				_ = b.Close()
				t.Fatal("connected")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "pa55") {
				t.Errorf("error %q shows the password", err)
			}
		})
	}
	// Without a password the server asks for one.
	nopass := brokertest.RedisSecure(t, brokertest.SecureRedisConfig{Password: "s3cret"})
	if _, err := dialRedisSecure(broker.RedisConfig{URL: "redis://" + nopass.Addr}); err == nil || !strings.Contains(err.Error(), "NOAUTH") || !strings.Contains(err.Error(), "--redis-url") {
		t.Fatalf("no password: %v", err)
	}
}
