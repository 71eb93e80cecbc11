package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/gateway"
	"github.com/golang-jwt/jwt/v5"
	"go.uber.org/zap"
)

// TestWSReloadsItsJWTSecret: fanwire ws loads --jwt-secret-file again
// when it is replaced, without a restart; with --jwt-key-grace 0 the old
// secret stops verifying at once; the reload is counted in /metrics.
func TestWSReloadsItsJWTSecret(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "secret")
	old, renewed := strings.Repeat("o", 40), strings.Repeat("n", 40)
	if err := os.WriteFile(secretFile, []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := startWS(t, zap.NewNop(), "--jwt-secret-file", secretFile, "--jwt-key-grace", "0")
	token := func(secret string) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "u", "exp": time.Now().Add(time.Hour).Unix()}).SignedString([]byte(secret))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	admitted := func(tok string) bool {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, _, err := websocket.Dial(ctx, "ws://"+addr+"/ws?token="+tok, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		_, msg, err := c.Read(ctx)
		if websocket.CloseStatus(err) == gateway.CloseUnauthorized {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(string(msg), `"ready"`)
	}
	if !admitted(token(old)) || admitted(token(renewed)) {
		t.Fatal("at start: want the old secret's token admitted, the new one's refused")
	}
	tmp := secretFile + ".new"
	if err := os.WriteFile(tmp, []byte(renewed+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, secretFile); err != nil {
		t.Fatal(err)
	}
	// Looked at within the check interval (2 s), on a verification.
	for deadline := time.Now().Add(15 * time.Second); !admitted(token(renewed)); {
		if time.Now().After(deadline) {
			t.Fatal("the renewed secret's token is still refused")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if admitted(token(old)) {
		t.Error("with --jwt-key-grace 0 the old secret's token is still admitted")
	}
	if code, body := get(t, "http://"+addr+"/metrics"); code != 200 || !strings.Contains(body, `fanwire_file_reloads_total{file="jwt_secret",result="ok"} 1`) {
		t.Errorf("/metrics: %d, no jwt_secret reload counted:\n%s", code, grepLines(body, "reloads"))
	}
}
