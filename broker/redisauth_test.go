package broker_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
)

// narrowACL is a Redis ACL with only what fanwire needs on stream "fw".
var narrowACL = []string{"~fw", "~fw:*", "resetchannels", "-@all", "+ping", "+hello",
	"+xadd", "+xread", "+xrange", "+xrevrange", "+xinfo|stream", "+eval", "+evalsha", "+get", "+set", "+hget", "+hset", "+hscan", "+hdel"}

func dialRedisSecure(cfg broker.RedisConfig) (*broker.Redis, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return broker.DialRedis(ctx, cfg)
}

// TestRedisSecured: a real redis-server with a password (requirepass), an
// ACL user, TLS with a CA the test made, and TLS with client
// certificates; each carries an event.
func TestRedisSecured(t *testing.T) {
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
