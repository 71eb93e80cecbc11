package gateway_test

import (
	"io"
	"net/http"
	"os"
	"testing"

	"github.com/fanwire/fanwire/gateway"
)

// TestClientFilesServed: every node serves the embedded JavaScript client
// and its declarations, console or not: the bytes on disk, with their
// content type, a strong ETag (304 without a body on If-None-Match),
// no-cache, any origin (module scripts are fetched in CORS mode) and
// nosniff; HEAD answers the headers alone.
func TestClientFilesServed(t *testing.T) {
	for _, console := range []bool{true, false} {
		e := newEnv(t, func(c *gateway.Config) { c.Console = console })
		for path, ct := range map[string]string{
			"/fanwire.js":   "text/javascript; charset=utf-8",
			"/fanwire.d.ts": "application/typescript; charset=utf-8",
		} {
			want, err := os.ReadFile("client" + path)
			if err != nil {
				t.Fatal(err)
			}
			get := func(method, ifNoneMatch string) (*http.Response, []byte) {
				t.Helper()
				req, err := http.NewRequest(method, e.http.URL+path, nil)
				if err != nil {
					t.Fatal(err)
				}
				if ifNoneMatch != "" {
					req.Header.Set("If-None-Match", ifNoneMatch)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Fatal(err)
				}
				return resp, b
			}
			resp, body := get("GET", "")
			if resp.StatusCode != http.StatusOK || string(body) != string(want) {
				t.Fatalf("console %v: GET %s: %d, %d bytes; want 200 and the %d bytes of client%s", console, path, resp.StatusCode, len(body), len(want), path)
			}
			etag := resp.Header.Get("ETag")
			for h, v := range map[string]string{
				"Content-Type":                ct,
				"Cache-Control":               "no-cache",
				"Access-Control-Allow-Origin": "*",
				"X-Content-Type-Options":      "nosniff",
			} {
				if got := resp.Header.Get(h); got != v {
					t.Errorf("console %v: GET %s: %s %q, want %q", console, path, h, got, v)
				}
			}
			if len(etag) < 3 || etag[0] != '"' || etag[len(etag)-1] != '"' {
				t.Fatalf("GET %s: ETag %q, want a strong (quoted) one", path, etag)
			}
			resp, body = get("HEAD", "")
			if resp.StatusCode != http.StatusOK || len(body) != 0 || resp.Header.Get("ETag") != etag || resp.Header.Get("Content-Type") != ct {
				t.Errorf("HEAD %s: %d, %d bytes, ETag %q, Content-Type %q", path, resp.StatusCode, len(body), resp.Header.Get("ETag"), resp.Header.Get("Content-Type"))
			}
			resp, body = get("GET", etag)
			if resp.StatusCode != http.StatusNotModified || len(body) != 0 || resp.Header.Get("ETag") != etag {
				t.Errorf("GET %s If-None-Match %s: %d, %d bytes, ETag %q; want 304 with no body", path, etag, resp.StatusCode, len(body), resp.Header.Get("ETag"))
			}
			if resp, _ = get("GET", `"other"`); resp.StatusCode != http.StatusOK {
				t.Errorf("GET %s with a stale ETag: %d, want 200", path, resp.StatusCode)
			}
		}
		if !console {
			resp, err := http.Get(e.http.URL + "/")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("console off: GET / %d, want 404", resp.StatusCode)
			}
		}
	}
}
