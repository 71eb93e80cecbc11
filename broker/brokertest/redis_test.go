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
