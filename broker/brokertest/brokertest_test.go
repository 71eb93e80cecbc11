package brokertest

import (
	"errors"
	"testing"
)

func TestMain(m *testing.M) { VerifyTestMain(m) }

// TestRedisStartIsOnlyItsOwnServer: a server started on a port another
// redis-server holds fails with errPortTaken, however soon the other one
// answers PING (it would answer as if it were the new one).
func TestRedisStartIsOnlyItsOwnServer(t *testing.T) {
	first := StartRedis(t, t.TempDir(), 0)
	second := &RedisServer{Dir: t.TempDir(), Port: first.Port, t: t}
	if err := second.start(); !errors.Is(err, errPortTaken) {
		if second.cmd != nil {
			second.Kill()
		}
		t.Fatalf("a second server on %s: %v; want %v", first.Addr(), err, errPortTaken)
	}
	if second.cmd != nil {
		t.Fatal("the second server still runs")
	}
}

// TestNATSAnswersAsItself: the readiness check of a nats-server process
// takes an answer only from the server it started (by its name): one
// that another test runs on the port is not it.
func TestNATSAnswersAsItself(t *testing.T) {
	ns := NATS(t)
	if err := jetStreamAnswersAt(ns.ClientURL(), ns.Name()); err != nil {
		t.Fatalf("the server itself: %v", err)
	}
	if err := jetStreamAnswersAt(ns.ClientURL(), "brokertest-another"); err == nil {
		t.Fatal("another server's answer was taken")
	}
}
