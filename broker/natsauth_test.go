package broker_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
)

// roundTrip publishes one event through b and waits for Consume to see it.
func roundTrip(t *testing.T, b broker.Broker) {
	t.Helper()
	c := consume(t, b)
	if _, err := b.Publish(context.Background(), []broker.Outgoing{{Subject: "app.secure", Data: []byte(`"hi"`), ID: "secure-1"}}); err != nil {
		t.Fatal(err)
	}
	if got := c.waitFor(t, 1); string(got[0].Data) != `"hi"` {
		t.Fatalf("got %q", got[0].Data)
	}
	_ = c.stop() // Consume ends with the context's error
}

func dialSecure(cfg broker.NATSConfig, jetStream bool) (broker.Broker, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cfg.Subjects = []string{"app.>"}
	if jetStream {
		return broker.DialJetStream(ctx, broker.JetStreamConfig{NATSConfig: cfg, Storage: "memory"})
	}
	return broker.DialNATS(ctx, cfg)
}

// TestNATSSecured: Core NATS and JetStream through a real server that wants
// a user's .creds (an account in operator mode), an NKey, TLS with a CA the
// test made, and TLS with client certificates; each carries an event.
func TestNATSSecured(t *testing.T) {
	t.Parallel()
	ca := brokertest.NewCA(t)
	for _, tc := range []struct {
		name string
		sec  brokertest.SecureNATSConfig
		cfg  func(s brokertest.SecureNATS) broker.NATSConfig
	}{
		{"creds", brokertest.SecureNATSConfig{Auth: "creds"}, func(s brokertest.SecureNATS) broker.NATSConfig {
			return broker.NATSConfig{URL: s.Server.ClientURL(), CredsFile: s.CredsFile}
		}},
		{"nkey", brokertest.SecureNATSConfig{Auth: "nkey"}, func(s brokertest.SecureNATS) broker.NATSConfig {
			return broker.NATSConfig{URL: s.Server.ClientURL(), NKeyFile: s.NKeyFile}
		}},
		{"tls", brokertest.SecureNATSConfig{CA: ca}, func(s brokertest.SecureNATS) broker.NATSConfig {
			return broker.NATSConfig{URL: tlsURL(s), TLSCA: ca.File}
		}},
		{"mtls+creds", brokertest.SecureNATSConfig{CA: ca, VerifyClients: true, Auth: "creds"}, func(s brokertest.SecureNATS) broker.NATSConfig {
			return broker.NATSConfig{URL: tlsURL(s), TLSCA: ca.File, TLSCert: s.ClientCert, TLSKey: s.ClientKey, CredsFile: s.CredsFile}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := brokertest.NATSSecure(t, tc.sec)
			for _, js := range []bool{false, true} {
				b, err := dialSecure(tc.cfg(s), js)
				if err != nil {
					t.Fatalf("jetstream %v: %v", js, err)
				}
				roundTrip(t, b)
				if err := b.Close(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func tlsURL(s brokertest.SecureNATS) string {
	if u := s.Server.ClientURL(); strings.HasPrefix(u, "tls://") {
		return u
	}
	panic("server without TLS")
}

// TestNATSSecuredRefusals: a missing or malformed file fails before
// dialling with the flag and the file named; a server that refuses the
// credentials or presents an untrusted certificate is an error saying which
// flags to look at.
func TestNATSSecuredRefusals(t *testing.T) {
	t.Parallel()
	ca := brokertest.NewCA(t)
	creds := brokertest.NATSSecure(t, brokertest.SecureNATSConfig{CA: ca, VerifyClients: true, Auth: "creds"})
	other := brokertest.NATSSecure(t, brokertest.SecureNATSConfig{Auth: "creds"}) // another operator's user
	nkey := brokertest.NATSSecure(t, brokertest.SecureNATSConfig{Auth: "nkey"})
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	url := tlsURL(creds)
	good := broker.NATSConfig{URL: url, TLSCA: ca.File, TLSCert: creds.ClientCert, TLSKey: creds.ClientKey, CredsFile: creds.CredsFile}
	for _, tc := range []struct {
		name string
		cfg  func(c *broker.NATSConfig)
		want []string
	}{
		{"creds file missing", func(c *broker.NATSConfig) { c.CredsFile = missing }, []string{"--nats-creds", missing, "no such file"}},
		{"creds file not creds", func(c *broker.NATSConfig) { c.CredsFile = garbage }, []string{"--nats-creds", garbage, "JWT"}},
		{"nkey file missing", func(c *broker.NATSConfig) { *c = broker.NATSConfig{URL: nkey.Server.ClientURL(), NKeyFile: missing} }, []string{"--nats-nkey", missing}},
		{"nkey file not a seed", func(c *broker.NATSConfig) { *c = broker.NATSConfig{URL: nkey.Server.ClientURL(), NKeyFile: garbage} }, []string{"--nats-nkey", garbage}},
		{"both creds and nkey", func(c *broker.NATSConfig) { c.NKeyFile = nkey.NKeyFile }, []string{"--nats-creds", "--nats-nkey", "give one"}},
		{"ca missing", func(c *broker.NATSConfig) { c.TLSCA = missing }, []string{"--nats-tls-ca", missing}},
		{"ca not PEM", func(c *broker.NATSConfig) { c.TLSCA = garbage }, []string{"--nats-tls-ca", garbage, "no PEM certificate"}},
		{"cert without key", func(c *broker.NATSConfig) { c.TLSKey = "" }, []string{"--nats-tls-cert", "--nats-tls-key", "both"}},
		{"key not a key", func(c *broker.NATSConfig) { c.TLSKey = garbage }, []string{"--nats-tls-cert", "--nats-tls-key", garbage}},
		{"no creds", func(c *broker.NATSConfig) { c.CredsFile = "" }, []string{"Authorization Violation", "--nats-creds"}},
		{"another account's creds", func(c *broker.NATSConfig) { c.CredsFile = other.CredsFile }, []string{"Authorization Violation", "--nats-creds"}},
		{"user and password refused", func(c *broker.NATSConfig) {
			*c = broker.NATSConfig{URL: strings.Replace(nkey.Server.ClientURL(), "nats://", "nats://fanwire:pa55@", 1)}
		}, []string{"Authorization Violation", "user:password", "fanwire:xxxxx@"}},
		{"no nkey", func(c *broker.NATSConfig) { *c = broker.NATSConfig{URL: nkey.Server.ClientURL()} }, []string{"Authorization Violation", "--nats-nkey"}},
		{"untrusted certificate", func(c *broker.NATSConfig) { c.TLSCA = brokertest.NewCA(t).File }, []string{"certificate", "--nats-tls-ca"}},
		{"tls to a server without", func(c *broker.NATSConfig) {
			*c = broker.NATSConfig{URL: nkey.Server.ClientURL(), NKeyFile: nkey.NKeyFile, TLSCA: ca.File}
		},
			[]string{"secure connection not available", "--nats-tls-ca"}},
		{"no client certificate", func(c *broker.NATSConfig) { c.TLSCert, c.TLSKey = "", "" }, []string{"connect to nats"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			tc.cfg(&cfg)
			b, err := dialSecure(cfg, false)
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
}
