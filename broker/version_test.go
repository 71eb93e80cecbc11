package broker

import "testing"

// TestServerAtLeast: DialJetStream refuses a nats-server older than 2.9
// and filters on several subjects only from 2.10, by the version the
// server announces.
func TestServerAtLeast(t *testing.T) {
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
