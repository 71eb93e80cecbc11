package main

import (
	"bytes"
	"flag"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestAdminKeyFlags: the inspector is served only with --admin-key,
// FANWIRE_ADMIN_KEY or --admin-key-file, never by default (fanwire dev
// included), and then only to requests with that key.
func TestAdminKeyFlags(t *testing.T) {
	get := func(addr, key string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+addr+"/admin/connections", nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, dev := range []bool{false, true} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		var f wsFlags
		f.register(fs, dev)
		if d := fs.Lookup("admin-key").DefValue; d != "" {
			t.Fatalf("dev=%v: --admin-key defaults to %q, want none", dev, d)
		}
	}
	if addr := startWS(t, zap.NewNop(), "--allow-anonymous"); get(addr, "Some-Key") != http.StatusNotFound {
		t.Fatal("without --admin-key: /admin/connections is served")
	}

	file := filepath.Join(t.TempDir(), "admin")
	writeFile(t, file, "  Admin-Key-From-File-1-0123456789abcdef  \nignored\n")
	t.Run("flag", func(t *testing.T) {
		addr := startWS(t, zap.NewNop(), "--allow-anonymous", "--admin-key", "Admin-Key-Flag-2-0123456789abcdef")
		if get(addr, "") != http.StatusUnauthorized || get(addr, "Admin-Key-Flag-3-0123456789abcdef") != http.StatusUnauthorized || get(addr, "Admin-Key-Flag-2-0123456789abcdef") != http.StatusOK {
			t.Fatal("--admin-key: want 401 without or with another key, 200 with it")
		}
	})
	t.Run("env", func(t *testing.T) {
		t.Setenv("FANWIRE_ADMIN_KEY", "Admin-Key-Env-4-0123456789abcdef")
		if addr := startWS(t, zap.NewNop(), "--allow-anonymous"); get(addr, "Admin-Key-Env-4-0123456789abcdef") != http.StatusOK {
			t.Fatal("FANWIRE_ADMIN_KEY not taken")
		}
	})
	t.Run("file", func(t *testing.T) {
		addr := startWS(t, zap.NewNop(), "--allow-anonymous", "--admin-key-file", file)
		if get(addr, "Admin-Key-From-File-1-0123456789abcdef") != http.StatusOK || get(addr, "ignored") != http.StatusUnauthorized {
			t.Fatal("--admin-key-file: want its first line, trimmed, as the key")
		}
	})
	t.Run("both", func(t *testing.T) {
		var out, errOut bytes.Buffer
		code := run([]string{"ws", "--allow-anonymous", "--nats-url", "nats://127.0.0.1:1", "--listen", "127.0.0.1:0",
			"--admin-key", "Admin-Key-Both-5-0123456789abcdef", "--admin-key-file", file}, &out, &errOut)
		if code != 1 || !strings.Contains(errOut.String(), "--admin-key and --admin-key-file: give one") || strings.Contains(errOut.String(), "Admin-Key-Both-5-0123456789abcdef") {
			t.Fatalf("exit %d, stderr %q: want 1 and the conflict named, without the key", code, errOut.String())
		}
	})
	// A key under 32 characters refuses the start, before anything
	// connects, naming where it came from and its length, never the key.
	short := filepath.Join(t.TempDir(), "short")
	writeFile(t, short, "Short-Key-File-9\n")
	for _, tc := range []struct {
		name, env string
		args      []string
		want      string
	}{
		{name: "short flag", args: []string{"--admin-key", "Short-Key-Flag-6"}, want: "--admin-key (FANWIRE_ADMIN_KEY): the key has 16 characters, the inspector needs at least 32"},
		{name: "short env", env: "Short-Key-Env-7", want: "--admin-key (FANWIRE_ADMIN_KEY): the key has 15 characters, the inspector needs at least 32"},
		{name: "31 characters", args: []string{"--admin-key", strings.Repeat("k", 31)}, want: "the key has 31 characters"},
		{name: "short file", args: []string{"--admin-key-file", short}, want: "--admin-key-file " + short + ": its first line, the key has 16 characters, the inspector needs at least 32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("FANWIRE_ADMIN_KEY", tc.env)
			}
			var out, errOut bytes.Buffer
			args := append([]string{"ws", "--allow-anonymous", "--nats-url", "nats://127.0.0.1:1", "--listen", "127.0.0.1:0"}, tc.args...)
			code := run(args, &out, &errOut)
			if code != 1 || !strings.Contains(errOut.String(), tc.want) || strings.Contains(errOut.String(), "Short-Key") || strings.Contains(errOut.String(), "kkkk") || strings.Contains(errOut.String(), "nats") {
				t.Fatalf("exit %d, stderr %q: want 1 and %q, without the key, before the broker is dialled", code, errOut.String(), tc.want)
			}
		})
	}
}
