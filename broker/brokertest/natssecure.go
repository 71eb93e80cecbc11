package brokertest

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// SecureNATSConfig says how NATSSecure secures its server.
type SecureNATSConfig struct {
	// CA, when set, turns TLS on: the server presents a certificate CA
	// issued, and clients must connect with TLS.
	CA *CA
	// VerifyClients (with CA) requires a client certificate CA issued.
	VerifyClients bool
	// Auth is "" (none), "creds" (operator mode: an operator, an account
	// with JetStream, and a user whose .creds file is returned) or "nkey"
	// (one user known by its NKey, whose seed file is returned).
	Auth string
}

// SecureNATS is a NATSSecure server and the files its clients need.
type SecureNATS struct {
	Server     *server.Server
	CredsFile  string // Auth "creds": the user's JWT and seed
	NKeyFile   string // Auth "nkey": the user's seed
	ClientCert string // CA set: a client certificate and key CA issued
	ClientKey  string
}

// NATSSecure starts an embedded NATS server with JetStream secured as cfg
// says, its files in t.TempDir(), stopped by t.Cleanup.
func NATSSecure(t testing.TB, cfg SecureNATSConfig) SecureNATS {
	t.Helper()
	dir := t.TempDir()
	var out SecureNATS
	opts := &server.Options{
		ServerName: "fanwire-secure",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   filepath.Join(dir, "store"),
		NoSigs:     true,
		NoLog:      true,
	}
	if cfg.CA != nil {
		certFile, keyFile := cfg.CA.Issue(t, dir, "nats-server")
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			t.Fatalf("brokertest: nats server certificate: %v", err)
		}
		opts.TLS = true
		opts.TLSTimeout = 2
		opts.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if cfg.VerifyClients {
			opts.TLSVerify = true
			opts.TLSConfig.ClientCAs = cfg.CA.Pool
			opts.TLSConfig.ClientAuth = tls.RequireAndVerifyClientCert
		}
		out.ClientCert, out.ClientKey = cfg.CA.Issue(t, dir, "nats-client")
	}
	switch cfg.Auth {
	case "":
	case "nkey":
		user := newKey(t, nkeys.CreateUser)
		pub, _ := user.PublicKey()
		seed, _ := user.Seed()
		opts.Nkeys = []*server.NkeyUser{{Nkey: pub}}
		out.NKeyFile = filepath.Join(dir, "user.nk")
		if err := os.WriteFile(out.NKeyFile, append(seed, '\n'), 0o600); err != nil {
			t.Fatalf("brokertest: %v", err)
		}
	case "creds":
		operator, account, user := newKey(t, nkeys.CreateOperator), newKey(t, nkeys.CreateAccount), newKey(t, nkeys.CreateUser)
		opub, _ := operator.PublicKey()
		apub, _ := account.PublicKey()
		upub, _ := user.PublicKey()
		oc := jwt.NewOperatorClaims(opub)
		oc.Name = "fanwire-test"
		ojwt, err := oc.Encode(operator)
		if err != nil {
			t.Fatalf("brokertest: operator jwt: %v", err)
		}
		// Decoded again, as a server reading its configuration would.
		if oc, err = jwt.DecodeOperatorClaims(ojwt); err != nil {
			t.Fatalf("brokertest: operator jwt: %v", err)
		}
		ac := jwt.NewAccountClaims(apub)
		ac.Name = "APP"
		ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		ajwt, err := ac.Encode(operator)
		if err != nil {
			t.Fatalf("brokertest: account jwt: %v", err)
		}
		uc := jwt.NewUserClaims(upub)
		uc.Name = "fanwire"
		ujwt, err := uc.Encode(account)
		if err != nil {
			t.Fatalf("brokertest: user jwt: %v", err)
		}
		seed, _ := user.Seed()
		creds, err := jwt.FormatUserConfig(ujwt, seed)
		if err != nil {
			t.Fatalf("brokertest: creds: %v", err)
		}
		out.CredsFile = filepath.Join(dir, "user.creds")
		if err := os.WriteFile(out.CredsFile, creds, 0o600); err != nil {
			t.Fatalf("brokertest: %v", err)
		}
		// The server wants a system account in operator mode.
		system := newKey(t, nkeys.CreateAccount)
		spub, _ := system.PublicKey()
		sc := jwt.NewAccountClaims(spub)
		sc.Name = "SYS"
		sjwt, err := sc.Encode(operator)
		if err != nil {
			t.Fatalf("brokertest: system account jwt: %v", err)
		}
		resolver := &server.MemAccResolver{}
		for pub, j := range map[string]string{apub: ajwt, spub: sjwt} {
			if err := resolver.Store(pub, j); err != nil {
				t.Fatalf("brokertest: account resolver: %v", err)
			}
		}
		opts.TrustedOperators = []*jwt.OperatorClaims{oc}
		opts.AccountResolver = resolver
		opts.SystemAccount = spub
	default:
		t.Fatalf("brokertest: NATSSecure: Auth %q: want \"\", \"creds\" or \"nkey\"", cfg.Auth)
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("brokertest: secure nats: %v", err)
	}
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("brokertest: secure nats not ready for connections after 10s")
	}
	out.Server = ns
	return out
}

func newKey(t testing.TB, create func() (nkeys.KeyPair, error)) nkeys.KeyPair {
	t.Helper()
	kp, err := create()
	if err != nil {
		t.Fatalf("brokertest: nkey: %v", err)
	}
	return kp
}
