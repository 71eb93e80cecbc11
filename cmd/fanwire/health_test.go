package main

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHealth runs "fanwire health" in-process against real HTTP servers:
// exit 0 on a 2xx, 1 otherwise with one line on stderr saying why.
func TestHealth(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`{"status":"ok"}` + "\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte("{\"status\":\"not ready\",\n\"reasons\":[\"draining\"]}\n"))
	})
	mux.HandleFunc("GET /moved", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/healthz", http.StatusFound)
	})
	release := make(chan struct{})
	mux.HandleFunc("GET /slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	defer close(release)

	// A port nothing listens on: bind one, note it, close it.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String() + "/healthz"
	ln.Close()

	for _, tc := range []struct {
		name string
		args []string
		code int
		want []string
	}{
		{"200", []string{"--url", srv.URL + "/healthz"}, 0, nil},
		{"503", []string{"--url", srv.URL + "/readyz"}, 1,
			[]string{"fanwire health: GET " + srv.URL + "/readyz: 503 Service Unavailable", `"reasons":["draining"]`}},
		{"redirect is not followed", []string{"--url", srv.URL + "/moved"}, 1,
			[]string{"GET " + srv.URL + "/moved: 302 Found"}},
		{"connection refused", []string{"--url", refused}, 1,
			[]string{"fanwire health: GET " + refused + ": ", "connection refused"}},
		{"timeout", []string{"--url", srv.URL + "/slow", "--timeout", "200ms"}, 1,
			[]string{"fanwire health: GET " + srv.URL + "/slow: no answer within 200ms"}},
		{"not a URL", []string{"--url", "127.0.0.1:8080/healthz"}, 1,
			[]string{`fanwire health: --url "127.0.0.1:8080/healthz": want an http:// or https:// URL`}},
		{"bad timeout", []string{"--url", srv.URL + "/healthz", "--timeout", "0s"}, 1,
			[]string{"fanwire health: --timeout 0s: want a positive duration"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			start := time.Now()
			code := run(append([]string{"health"}, tc.args...), &out, &errOut)
			if code != tc.code {
				t.Errorf("exit %d, want %d; stderr %q", code, tc.code, errOut.String())
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("took %v", took)
			}
			if out.Len() != 0 {
				t.Errorf("stdout %q, want nothing", out.String())
			}
			if tc.code == 0 {
				if errOut.Len() != 0 {
					t.Errorf("stderr %q, want nothing", errOut.String())
				}
				return
			}
			s := errOut.String()
			if strings.Count(s, "\n") != 1 || !strings.HasSuffix(s, "\n") {
				t.Errorf("stderr %q, want exactly one line", s)
			}
			for _, w := range tc.want {
				if !strings.Contains(s, w) {
					t.Errorf("stderr %q, want it to contain %q", s, w)
				}
			}
		})
	}

	// From the environment, as every flag; the command line wins.
	t.Run("environment", func(t *testing.T) {
		t.Setenv("FANWIRE_URL", srv.URL+"/readyz")
		var out, errOut bytes.Buffer
		if code := run([]string{"health"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "503") {
			t.Errorf("FANWIRE_URL=/readyz: exit %d, stderr %q; want 1 and the 503", code, errOut.String())
		}
		errOut.Reset()
		if code := run([]string{"health", "--url", srv.URL + "/healthz"}, &out, &errOut); code != 0 {
			t.Errorf("--url over FANWIRE_URL: exit %d, stderr %q; want 0", code, errOut.String())
		}
	})
}

// TestLoadAPIKeys: the --api-keys-file format, and errors that name the
// line, never the key.
func TestLoadAPIKeys(t *testing.T) {
	p := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(p, []byte("# keys\norders k-1234567890 orders.>,public.*\n\nadmin  k-admin-000  # anywhere\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keys, err := loadAPIKeys(p)
	if err != nil || len(keys) != 2 || keys[0].Name != "orders" || strings.Join(keys[0].Publish, " ") != "orders.> public.*" || keys[1].Key != "k-admin-000" || keys[1].Publish != nil {
		t.Fatalf("%+v %v", keys, err)
	}
	if err := os.WriteFile(p, []byte("only-a-name-secretkey\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadAPIKeys(p); err == nil || !strings.Contains(err.Error(), "line 1") || strings.Contains(err.Error(), "secretkey") {
		t.Fatalf("err %v", err)
	}
}
