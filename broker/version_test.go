package broker

import "testing"

// TestServerAtLeast: DialJetStream refuses a nats-server older than 2.9
// and filters on several subjects only from 2.10, by the version the
// server announces.
func TestServerAtLeast(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		version      string
		major, minor int
		want         bool
	}{
		{"2.9.10", 2, 9, true},
		{"2.9.10", 2, 10, false},
		{"2.10.0", 2, 10, true},
		{"2.8.4", 2, 9, false},
		{"2.11.0-RC.1", 2, 10, true},
		{"2.15.2", 2, 9, true},
		{"3.0.0", 2, 10, true},
		{"1.4.1", 2, 9, false},
		{"", 2, 9, false},
		{"garbage", 2, 9, false},
	} {
		if got := serverAtLeast(c.version, c.major, c.minor); got != c.want {
			t.Errorf("serverAtLeast(%q, %d, %d) = %v, want %v", c.version, c.major, c.minor, got, c.want)
		}
	}
}

// TestRedisTooOld: DialRedis refuses a Redis older than 7.0 (whose XINFO
// STREAM lacks what Replay tells an expired cursor by), by the
// redis_version of its INFO.
func TestRedisTooOld(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		info    string
		version string
		old     bool
	}{
		{"# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n", "7.0.15", false},
		{"# Server\r\nredis_version:6.2.14\r\n", "6.2.14", true},
		{"# Server\r\nredis_version:8.2.1\r\n", "8.2.1", false},
		{"# Server\r\nredis_mode:standalone\r\n", "", false}, // no version: not refused
		{"redis_version:5.0.7\n", "5.0.7", true},
	} {
		if v, old := redisTooOld(c.info); v != c.version || old != c.old {
			t.Errorf("redisTooOld(%q) = %q, %v; want %q, %v", c.info, v, old, c.version, c.old)
		}
	}
}
