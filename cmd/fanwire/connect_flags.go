package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/fanwire/fanwire/gateway"
)

// connectLimitFlags are the admission limits on new connections besides
// the caps (gateway.Config's TrustedProxies, IPLimitIPv6Prefix,
// MaxConnectRate, ConnectBurst, ConnectQueue, ConnectQueueWait).
type connectLimitFlags struct {
	trustedProxies listFlag
	ipv6Prefix     int
	rate           int
	burst          int
	queue          int
	queueWait      time.Duration
}

func (f *connectLimitFlags) register(fs *flag.FlagSet) {
	fs.Var(&f.trustedProxies, "trusted-proxies", "addresses and CIDR prefixes of your load balancers and proxies, comma-separated (e.g. 10.0.0.0/8,192.0.2.7): from one of them, X-Forwarded-For names the client (read from the right, past trusted entries), for --max-connections-per-ip and logs; from any other peer the header is ignored")
	fs.IntVar(&f.ipv6Prefix, "ip-limit-ipv6-prefix", 64, "--max-connections-per-ip counts an IPv6 client by this prefix length of its address, 1 to 128 (a host is given a whole /64 and may pick any address in it; 128: each address); an IPv4 client, IPv4-mapped ones included, by its address")
	fs.IntVar(&f.rate, "max-connect-rate", gateway.DefaultMaxConnectRate, "WebSocket upgrades (/ws and /graphql) admitted per second on this node, in bursts of --connect-burst; past it a request waits its turn (--connect-queue, --connect-queue-wait) or gets 503 connect_rate with Retry-After; 0: no limit")
	fs.IntVar(&f.burst, "connect-burst", 0, "upgrades admitted at once after a quiet period (0: --max-connect-rate, one second's worth)")
	fs.IntVar(&f.queue, "connect-queue", 1024, "upgrade requests that may wait for admission under --max-connect-rate; past it: 503 connect_rate (0: none wait)")
	fs.DurationVar(&f.queueWait, "connect-queue-wait", 5*time.Second, "longest an upgrade request waits for admission; one whose turn would come later gets 503 connect_rate at once (0: none wait)")
}

// config returns the gateway.Config fields of the flags; a bad
// --trusted-proxies entry is an error naming the flag.
func (f *connectLimitFlags) config() (gateway.Config, error) {
	proxies, err := gateway.ParseTrustedProxies(f.trustedProxies)
	if err != nil {
		return gateway.Config{}, fmt.Errorf("--trusted-proxies: %w", err)
	}
	if f.ipv6Prefix < 1 || f.ipv6Prefix > 128 {
		return gateway.Config{}, fmt.Errorf("--ip-limit-ipv6-prefix: must be 1 to 128 (got %d)", f.ipv6Prefix)
	}
	if f.burst < 0 {
		return gateway.Config{}, fmt.Errorf("--connect-burst: must not be negative (got %d)", f.burst)
	}
	c := gateway.Config{
		TrustedProxies:    proxies,
		IPLimitIPv6Prefix: f.ipv6Prefix,
		MaxConnectRate:    f.rate,
		ConnectBurst:      f.burst,
		ConnectQueue:      f.queue,
		ConnectQueueWait:  f.queueWait,
	}
	// The flags' 0 is "none"; the Config's zero is its default.
	if c.MaxConnectRate <= 0 {
		c.MaxConnectRate = -1
	}
	if c.ConnectQueue <= 0 || c.ConnectQueueWait <= 0 {
		c.ConnectQueue, c.ConnectQueueWait = -1, 0
	}
	return c, nil
}
