package admission

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
)

// ParseTrustedProxies parses addresses and CIDR prefixes ("10.0.0.0/8",
// "192.0.2.7", "2001:db8::/32") for Config.TrustedProxies.
func ParseTrustedProxies(list []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if strings.Contains(s, "/") {
			p, err := netip.ParsePrefix(s)
			if err != nil {
				return nil, fmt.Errorf("%q: not an address or CIDR prefix: %w", s, err)
			}
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, fmt.Errorf("%q: not an address or CIDR prefix: %w", s, err)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// TrustedProxies are the peers whose X-Forwarded-For the gateway believes.
type TrustedProxies []netip.Prefix // static after New

func (t TrustedProxies) Contains(a netip.Addr) bool {
	a = a.Unmap().WithZone("") // a link-local peer's zone names our interface, not the proxy
	for _, p := range t {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ClientAddr is r's client address. Without a trusted peer it is the
// socket's peer (RemoteAddr without its port). From a trusted peer,
// X-Forwarded-For is walked from the right (the entry the peer appended)
// leftwards past trusted proxies, and the first untrusted address is the
// client's. Entries left of that are the client's own claims and are never
// read. A malformed entry stops the walk: the client is then the last
// trusted hop reached (the peer itself, when the header's last entry is
// malformed), as when every entry is a trusted proxy.
func (t TrustedProxies) ClientAddr(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if len(t) == 0 {
		return host
	}
	peer, err := netip.ParseAddr(host)
	if err != nil || !t.Contains(peer) {
		return host
	}
	hop := peer.Unmap()
	xff := r.Header.Values("X-Forwarded-For")
	// Several header lines are one list, in order (RFC 9110 §5.3).
	for i := len(xff) - 1; i >= 0; i-- {
		line := xff[i]
		for line != "" {
			entry := line
			if j := strings.LastIndexByte(line, ','); j >= 0 {
				entry, line = line[j+1:], line[:j]
			} else {
				line = ""
			}
			entry = strings.TrimSpace(entry)
			if entry == "" {
				continue // "a,,b" or a trailing comma: no hop
			}
			a, ok := parseForwarded(entry)
			if !ok {
				return hop.String()
			}
			if !t.Contains(a) {
				return a.String()
			}
			hop = a
		}
	}
	return hop.String()
}

// parseForwarded parses one X-Forwarded-For entry: an address, possibly
// with a port ("192.0.2.1:4711", "[2001:db8::1]:4711") or bracketed, as
// some proxies write them.
func parseForwarded(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil && ap.Addr().Zone() == "" {
		return ap.Addr().Unmap(), true
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil && a.Is6() && a.Zone() == "" {
			return a.Unmap(), true
		}
	}
	return netip.Addr{}, false
}

// ipKey is what MaxConnectionsPerIP counts a client by: its IPv4 address
// or its IPv6 prefix, or, for a peer address that is not an IP (none over
// TCP), the address's text.
type IPKey struct {
	p   netip.Prefix
	raw string // only when the address does not parse
}

// IPGroup is client address addr's key, IPv6 addresses grouped by their
// first v6bits (Config.IPLimitIPv6Prefix, 1 to 128). IPv4-mapped IPv6
// addresses are IPv4 ones. It does not allocate: every upgrade calls it.
func IPGroup(addr string, v6bits int) IPKey {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return IPKey{raw: addr}
	}
	a = a.Unmap()
	bits := 32
	if a.Is6() {
		bits = v6bits
	}
	p, err := a.Prefix(bits) // drops a link-local address's zone
	if err != nil {
		return IPKey{raw: addr} // bits out of range: validate refuses those
	}
	return IPKey{p: p}
}

// IPCounts counts connections per client address group (IPGroup).
type IPCounts struct {
	mu sync.Mutex
	n  map[IPKey]int // guarded by mu
}

// acquire counts a connection from k unless it has max already (0: no cap).
func (c *IPCounts) Acquire(k IPKey, max int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if max > 0 && c.n[k] >= max {
		return false
	}
	if c.n == nil {
		c.n = make(map[IPKey]int)
	}
	c.n[k]++
	return true
}

func (c *IPCounts) Release(k IPKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[k]--; c.n[k] <= 0 {
		delete(c.n, k)
	}
}
