package admission

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

func TestClientAddr(t *testing.T) {
	trusted, err := ParseTrustedProxies([]string{"10.0.0.0/8", " 192.0.2.7 ", "2001:db8::/32", "fe80::/10", ""})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, remote string
		xff          []string
		want         string
	}{
		{"untrusted peer: header ignored", "198.51.100.1:5000", []string{"203.0.113.9"}, "198.51.100.1"},
		{"trusted peer without header", "10.1.2.3:5000", nil, "10.1.2.3"},
		{"trusted peer", "10.1.2.3:5000", []string{"203.0.113.9"}, "203.0.113.9"},
		{"a single trusted address", "192.0.2.7:5000", []string{"203.0.113.9"}, "203.0.113.9"},
		{"next to a trusted address", "192.0.2.8:5000", []string{"203.0.113.9"}, "192.0.2.8"},
		{"client's own claims left of it ignored", "10.1.2.3:5000", []string{"1.1.1.1, 203.0.113.9"}, "203.0.113.9"},
		{"trusted hops skipped", "10.1.2.3:5000", []string{"1.1.1.1, 203.0.113.9, 10.9.9.9, 192.0.2.7"}, "203.0.113.9"},
		{"lines are one list", "10.1.2.3:5000", []string{"1.1.1.1", "203.0.113.9, 10.9.9.9"}, "203.0.113.9"},
		{"last line first", "10.1.2.3:5000", []string{"1.1.1.1", "10.9.9.9"}, "1.1.1.1"},
		{"every entry trusted: the leftmost hop", "10.1.2.3:5000", []string{"10.9.9.9, 10.8.8.8"}, "10.9.9.9"},
		{"empty header", "10.1.2.3:5000", []string{""}, "10.1.2.3"},
		{"empty elements", "10.1.2.3:5000", []string{" , 203.0.113.9 ,, "}, "203.0.113.9"},
		{"with a port", "10.1.2.3:5000", []string{"203.0.113.9:4711"}, "203.0.113.9"},
		{"IPv6", "[2001:db8::1]:5000", []string{"2001:db8:ffff::1, 2600::1"}, "2600::1"},
		{"IPv6 bracketed", "[2001:db8::1]:5000", []string{"[2600::1]"}, "2600::1"},
		{"IPv6 with a port", "[2001:db8::1]:5000", []string{"[2600::1]:443"}, "2600::1"},
		{"link-local peer with a zone", "[fe80::1%eth0]:5000", []string{"203.0.113.9"}, "203.0.113.9"},
		{"IPv4-mapped peer", "[::ffff:10.1.2.3]:5000", []string{"203.0.113.9"}, "203.0.113.9"},
		{"IPv4-mapped entry", "10.1.2.3:5000", []string{"::ffff:203.0.113.9"}, "203.0.113.9"},
		{"IPv4-mapped trusted entry", "10.1.2.3:5000", []string{"203.0.113.9, ::ffff:10.9.9.9"}, "203.0.113.9"},
		{"malformed: the peer", "10.1.2.3:5000", []string{"203.0.113.9, unknown"}, "10.1.2.3"},
		{"malformed behind a trusted hop: that hop", "10.1.2.3:5000", []string{"garbage, 10.9.9.9"}, "10.9.9.9"},
		{"a zone is malformed", "10.1.2.3:5000", []string{"fe80::1%eth0"}, "10.1.2.3"},
		{"a bad port is malformed", "10.1.2.3:5000", []string{"203.0.113.9:99999"}, "10.1.2.3"},
		{"a hostname is malformed", "10.1.2.3:5000", []string{"client.example.com"}, "10.1.2.3"},
		{"RemoteAddr without a port", "10.1.2.3", []string{"203.0.113.9"}, "203.0.113.9"},
		{"RemoteAddr not an address", "pipe", []string{"203.0.113.9"}, "pipe"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &http.Request{RemoteAddr: tc.remote, Header: http.Header{}}
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			if got := TrustedProxies(trusted).ClientAddr(r); got != tc.want {
				t.Fatalf("client %q, want %q", got, tc.want)
			}
		})
	}
	r := &http.Request{RemoteAddr: "10.1.2.3:5000", Header: http.Header{"X-Forwarded-For": {"203.0.113.9"}}}
	if got := TrustedProxies(nil).ClientAddr(r); got != "10.1.2.3" {
		t.Fatalf("no trusted proxies: client %q, want the peer", got)
	}
}

func TestParseTrustedProxies(t *testing.T) {
	got, err := ParseTrustedProxies([]string{"10.1.2.3/8", "::ffff:192.0.2.1", "2001:db8::/32"})
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.1/32"), netip.MustParsePrefix("2001:db8::/32")}
	if len(got) != len(want) {
		t.Fatalf("%v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%v, want %v", got, want)
		}
	}
	for _, bad := range []string{"10.0.0.0/33", "10.0.0", "example.com", "10.0.0.0/8/8", "::1/129"} {
		if _, err := ParseTrustedProxies([]string{"10.0.0.1", bad}); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("%q: %v, want an error naming it", bad, err)
		}
	}
}

// FuzzClientAddr: whatever X-Forwarded-For holds, the client is the peer,
// or an address the header names that is not trusted, or a trusted hop;
// and never an address from an untrusted peer's header.
func FuzzClientAddr(f *testing.F) {
	for _, s := range []string{"203.0.113.9", "1.1.1.1, 10.9.9.9", "[2600::1]:443", ",,", "garbage, 10.0.0.1", "::ffff:1.2.3.4"} {
		f.Add("10.1.2.3:5000", s)
		f.Add("198.51.100.1:5000", s)
	}
	trusted := TrustedProxies{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}
	f.Fuzz(func(t *testing.T, remote, xff string) {
		r := &http.Request{RemoteAddr: remote, Header: http.Header{"X-Forwarded-For": {xff}}}
		got := trusted.ClientAddr(r)
		bare := &http.Request{RemoteAddr: remote, Header: http.Header{}}
		peer := trusted.ClientAddr(bare)
		if got == peer {
			return
		}
		pa, err := netip.ParseAddr(peer)
		if err != nil || !trusted.Contains(pa) {
			t.Fatalf("peer %q is not trusted, yet the client is %q from %q", remote, got, xff)
		}
		a, err := netip.ParseAddr(got)
		if err != nil {
			t.Fatalf("client %q is not an address", got)
		}
		found := false
		for e := range strings.SplitSeq(xff, ",") {
			if b, ok := parseForwarded(strings.TrimSpace(e)); ok && b == a {
				found = true
			}
		}
		if !found {
			t.Fatalf("client %q is not in %q", got, xff)
		}
	})
}

func TestIPGroup(t *testing.T) {
	for _, tc := range []struct {
		addr string
		bits int
		want IPKey
	}{
		{"198.51.100.7", 64, IPKey{p: netip.MustParsePrefix("198.51.100.7/32")}},
		{"::ffff:198.51.100.7", 64, IPKey{p: netip.MustParsePrefix("198.51.100.7/32")}},
		{"198.51.100.7", 8, IPKey{p: netip.MustParsePrefix("198.51.100.7/32")}}, // IPv4 stays per address
		{"2001:db8:1:2:3:4:5:6", 64, IPKey{p: netip.MustParsePrefix("2001:db8:1:2::/64")}},
		{"2001:db8:1:2:3:4:5:6", 48, IPKey{p: netip.MustParsePrefix("2001:db8:1::/48")}},
		{"2001:db8:1:2:3:4:5:6", 128, IPKey{p: netip.MustParsePrefix("2001:db8:1:2:3:4:5:6/128")}},
		{"2001:db8:1:2:3:4:5:6", 1, IPKey{p: netip.MustParsePrefix("::/1")}},
		{"fe80::1%eth0", 64, IPKey{p: netip.MustParsePrefix("fe80::/64")}},
		{"::1", 64, IPKey{p: netip.MustParsePrefix("::/64")}},
		{"pipe", 64, IPKey{raw: "pipe"}},
		{"", 64, IPKey{raw: ""}},
	} {
		if got := IPGroup(tc.addr, tc.bits); got != tc.want {
			t.Errorf("ipGroup(%q, %d) = %v, want %v", tc.addr, tc.bits, got, tc.want)
		}
	}
	if IPGroup("2001:db8:1:2::1", 64) != IPGroup("2001:db8:1:2:ffff:ffff:ffff:ffff", 64) {
		t.Error("two addresses of one /64: two groups")
	}
}

// TestIPGroupAllocs: grouping a client and counting it on the connect
// path allocates nothing once the count map has its entry's room.
func TestIPGroupAllocs(t *testing.T) {
	var c IPCounts
	for _, addr := range []string{"198.51.100.7", "2001:db8:1:2:3:4:5:6", "::ffff:198.51.100.7"} {
		c.Acquire(IPGroup(addr, 64), 0) // the map and its entry's room
		c.Release(IPGroup(addr, 64))
		if n := testing.AllocsPerRun(1000, func() {
			k := IPGroup(addr, 64)
			if !c.Acquire(k, 10) {
				t.Fatal("refused")
			}
			c.Release(k)
		}); n != 0 {
			t.Errorf("%s: %v allocations per connect, want 0", addr, n)
		}
	}
}

func BenchmarkIPGroup(b *testing.B) {
	var c IPCounts
	addrs := []string{"198.51.100.7", "2001:db8:1:2:3:4:5:6"}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		k := IPGroup(addrs[i&1], 64)
		c.Acquire(k, 0)
		c.Release(k)
	}
}
