package brokertest

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// SecureRedisConfig says how RedisSecure secures its server.
type SecureRedisConfig struct {
	// CA, when set, makes the server listen with TLS only, presenting a
	// certificate CA issued.
	CA *CA
	// VerifyClients (with CA) requires a client certificate CA issued.
	VerifyClients bool
	// Password, when set, is the default user's password (requirepass).
	Password string
	// User and UserPassword, when set, add an ACL user with UserRules
	// (default: everything, "~* &* +@all").
	User, UserPassword string
	UserRules          []string
}

// SecureRedis is a RedisSecure server and the files its clients need.
type SecureRedis struct {
	Addr       string // host:port: with a CA, the TLS port
	ClientCert string // CA set: a client certificate and key CA issued
	ClientKey  string
}

// RedisSecure starts a real redis-server (from PATH, built with TLS, as
// Debian's is) secured as cfg says, on a free loopback port with its files
// in t.TempDir(), killed by t.Cleanup. It fails the test when redis-server
// is missing or does not start.
func RedisSecure(t testing.TB, cfg SecureRedisConfig) SecureRedis {
	t.Helper()
	bin := redisServer(t)
	dir := t.TempDir()
	port := strconv.Itoa(freePort(t))
	logFile := filepath.Join(dir, "redis.log")
	args := []string{"--bind", "127.0.0.1", "--dir", dir, "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", logFile}
	var out SecureRedis
	out.Addr = "127.0.0.1:" + port
	var tc *tls.Config
	if cfg.CA != nil {
		certFile, keyFile := cfg.CA.Issue(t, dir, "redis-server")
		out.ClientCert, out.ClientKey = cfg.CA.Issue(t, dir, "redis-client")
		auth := "no"
		if cfg.VerifyClients {
			auth = "yes"
		}
		args = append(args, "--port", "0", "--tls-port", port, "--tls-cert-file", certFile, "--tls-key-file", keyFile,
			"--tls-ca-cert-file", cfg.CA.File, "--tls-auth-clients", auth)
		cert, err := tls.LoadX509KeyPair(out.ClientCert, out.ClientKey)
		if err != nil {
			t.Fatalf("brokertest: %v", err)
		}
		tc = &tls.Config{RootCAs: cfg.CA.Pool, Certificates: []tls.Certificate{cert}, ServerName: "127.0.0.1"}
	} else {
		args = append(args, "--port", port)
	}
	if cfg.Password != "" {
		args = append(args, "--requirepass", cfg.Password)
	}
	if cfg.User != "" {
		rules := cfg.UserRules
		if rules == nil {
			rules = []string{"~*", "&*", "+@all"}
		}
		args = append(append(args, "--user", cfg.User, "on", ">"+cfg.UserPassword), rules...)
	}
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		t.Fatalf("brokertest: start redis-server: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := pingAny(out.Addr, tc)
		if err == nil {
			return out
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logFile)
			t.Fatalf("brokertest: redis-server not answering on %s (TLS %v): %v\n%s", out.Addr, tc != nil, err, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pingAny sends PING (over TLS when tc is set) and takes +PONG or a
// refusal for want of a password (-NOAUTH) as a server that is up.
func pingAny(addr string, tc *tls.Config) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if tc != nil {
		c = tls.Client(c, tc)
	}
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") && !strings.HasPrefix(line, "-NOAUTH") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}
