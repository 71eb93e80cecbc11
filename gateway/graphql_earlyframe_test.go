package gateway_test

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestGraphQLEarlyFirstFrameKept: a client frame that reaches the gateway
// together with the upgrade request, or while net/http still holds it when
// the connection is hijacked, must be read as the connection's first frame.
//
// headless Chromium hit this (TestGraphQLBrowser, about one page load in 20
// under -race): graphql-ws sends connection_init the moment the 101 arrives;
// net/http's background read, still pending while Hijack flushes the 101,
// takes the frame's first byte (0x81), and the gateway then read the length
// byte 0x9A as a header: "received header with unexpected rsv bits set:
// false:false:true", closed 1002. Here the frame is sent in the same write as
// the request, so net/http's reader holds all of it at the hijack: the same
// path, deterministically.
func TestGraphQLEarlyFirstFrameKept(t *testing.T) {
	e := newEnv(t, nil)
	for _, tc := range []struct {
		name, path, subprotocol, send string
		want                          []string // the first text messages, in order
	}{
		{"graphql-transport-ws", "/graphql", "graphql-transport-ws", `{"type":"connection_init"}`, []string{`{"type":"connection_ack"}`}},
		{"native", "/ws", "", `{"type":"ping"}`, []string{"ready", `{"type":"pong"}`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", strings.TrimPrefix(e.http.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			req := "GET " + tc.path + " HTTP/1.1\r\nHost: " + strings.TrimPrefix(e.http.URL, "http://") + "\r\n" +
				"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n" +
				"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
			if tc.subprotocol != "" {
				req += "Sec-WebSocket-Protocol: " + tc.subprotocol + "\r\n"
			}
			req += "\r\n"
			// One write: the request and the first frame arrive together.
			if _, err := c.Write(append([]byte(req), maskedTextFrame(tc.send)...)); err != nil {
				t.Fatal(err)
			}
			// Well within GraphQLInitTimeout (3 s), after which a gateway
			// that lost the connection_init closes with 4408.
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("upgrade: %s", resp.Status)
			}
			// The native protocol may coalesce messages into one frame,
			// newline-separated.
			var got []string
			for len(got) < len(tc.want) {
				op, payload, err := readServerFrame(br)
				if err != nil {
					t.Fatalf("after %q, waiting for %q: %v: the gateway lost the frame sent with the upgrade request", got, tc.want[len(got):], err)
				}
				if op == 0x8 { // close
					code := 0
					if len(payload) >= 2 {
						code = int(binary.BigEndian.Uint16(payload))
					}
					t.Fatalf("gateway closed (%d %q) instead of answering %s: it lost the frame sent with the upgrade request", code, payload[min(2, len(payload)):], tc.send)
				}
				if op != 0x1 {
					t.Fatalf("frame opcode %x (%q), want text", op, payload)
				}
				got = append(got, strings.Split(string(payload), "\n")...)
			}
			for i, want := range tc.want {
				if want == "ready" {
					if !strings.HasPrefix(got[i], `{"type":"ready"`) {
						t.Fatalf("messages %q: #%d is not ready", got, i)
					}
				} else if got[i] != want {
					t.Fatalf("messages %q: #%d = %s, want %s", got, i, got[i], want)
				}
			}
		})
	}
}

// maskedTextFrame is one client text frame (masked, as RFC 6455 requires).
func maskedTextFrame(s string) []byte {
	if len(s) > 125 {
		panic("maskedTextFrame: payload too long")
	}
	mask := [4]byte{0x12, 0x34, 0x56, 0x78}
	b := []byte{0x81, 0x80 | byte(len(s)), mask[0], mask[1], mask[2], mask[3]}
	for i := range len(s) {
		b = append(b, s[i]^mask[i%4])
	}
	return b
}

// readServerFrame reads one unmasked server frame (no fragmentation).
func readServerFrame(r *bufio.Reader) (op byte, payload []byte, err error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var l [2]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return 0, nil, err
		}
		n = uint64(binary.BigEndian.Uint16(l[:]))
	case 127:
		var l [8]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(l[:])
	}
	payload = make([]byte, n)
	_, err = io.ReadFull(r, payload)
	return h[0] & 0x0f, payload, err
}
