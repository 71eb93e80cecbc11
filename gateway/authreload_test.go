package gateway_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestTokenKeysReloadWithGrace: the JWKS file and the HS256 secret file
// are loaded again when they change, without a restart: a WebSocket with a
// token signed by the new key is admitted; one signed by the key the
// files no longer hold still is for the grace period, then is refused. A
// file that does not load keeps the keys in force, is logged and counted,
// and is tried again at every check until it loads.
func TestTokenKeysReloadWithGrace(t *testing.T) {
	dir := t.TempDir()
	jwksFile, secretFile := filepath.Join(dir, "jwks.json"), filepath.Join(dir, "secret")
	keyA, keyB, keyC := ecKey(t), ecKey(t), ecKey(t)
	secret1, secret2 := testSecret+"-one", testSecret+"-two"
	swap(t, jwksFile, jwksOf(map[string]*ecdsa.PrivateKey{"a": keyA}))
	swap(t, secretFile, secret1+"\n")
	core, logs := observer.New(zap.InfoLevel)
	clock := &testClock{t: time.Now()}
	a, err := auth.NewJWTAuth(auth.JWTConfig{JWKSFile: jwksFile, SecretFile: secretFile, Logger: zap.New(core), Now: clock.now})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	for _, c := range a.Collectors() {
		reg.MustRegister(c)
	}
	e := newEnv(t, func(c *gateway.Config) { c.Authenticate = a.Grant })
	es := func(key *ecdsa.PrivateKey, kid string) string {
		return sign(t, jwt.SigningMethodES256, key, kid, jwt.MapClaims{"sub": kid, "exp": time.Now().Add(time.Hour).Unix()})
	}
	hs := func(secret string) string {
		return sign(t, jwt.SigningMethodHS256, []byte(secret), "", jwt.MapClaims{"sub": "hs", "exp": time.Now().Add(time.Hour).Unix()})
	}
	check := func(step string, want map[string]bool, tokens map[string]string) {
		t.Helper()
		for name, tok := range tokens {
			if got := admitted(t, e.wsURL(), tok); got != want[name] {
				t.Errorf("%s: a token signed with %s admitted %v, want %v", step, name, got, want[name])
			}
		}
	}
	tokens := map[string]string{"a": es(keyA, "a"), "b": es(keyB, "b"), "c": es(keyC, "c"), "secret1": hs(secret1), "secret2": hs(secret2)}
	check("at start", map[string]bool{"a": true, "secret1": true}, tokens)

	// Rotated: key a becomes b, the secret changes. Seen at the next
	// check; the old ones are within their grace.
	swap(t, jwksFile, jwksOf(map[string]*ecdsa.PrivateKey{"b": keyB}))
	swap(t, secretFile, secret2)
	clock.add(auth.DefaultKeyCheckInterval)
	check("rotated", map[string]bool{"a": true, "b": true, "secret1": true, "secret2": true}, tokens)

	// Past the grace: the removed keys stop verifying.
	clock.add(auth.DefaultKeyGrace)
	check("after the grace", map[string]bool{"b": true, "secret2": true}, tokens)

	// Files that do not load: the keys in force stay, and the files are
	// tried again at every check (logged once, counted each time).
	swap(t, jwksFile, `{"keys": [`)
	swap(t, secretFile, "short")
	for range 2 {
		clock.add(auth.DefaultKeyCheckInterval)
		check("bad files", map[string]bool{"b": true, "secret2": true}, tokens)
	}
	if n := logs.FilterMessageSnippet("does not load").Len(); n != 2 {
		t.Errorf("%d warnings for two files that do not load (checked twice), want 2: %v", n, logs.All())
	}
	// Fixed: key c is added beside b.
	swap(t, jwksFile, jwksOf(map[string]*ecdsa.PrivateKey{"b": keyB, "c": keyC}))
	clock.add(auth.DefaultKeyCheckInterval)
	check("fixed", map[string]bool{"b": true, "c": true, "secret2": true}, tokens)

	want := `
# HELP fanwire_file_reloads_total Loads of changed files after start, by result: failed means the file did not load (half written, malformed, a key that does not match) and what was loaded before is still served; it is tried again at every check until it loads.
# TYPE fanwire_file_reloads_total counter
fanwire_file_reloads_total{file="jwks",result="failed"} 2
fanwire_file_reloads_total{file="jwks",result="ok"} 2
fanwire_file_reloads_total{file="jwt_secret",result="failed"} 3
fanwire_file_reloads_total{file="jwt_secret",result="ok"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "fanwire_file_reloads_total"); err != nil {
		t.Error(err)
	}
}

// TestTokenKeyGraceNone: with a negative KeyGrace a removed key stops
// verifying as soon as the change is seen.
func TestTokenKeyGraceNone(t *testing.T) {
	jwksFile := filepath.Join(t.TempDir(), "jwks.json")
	keyA, keyB := ecKey(t), ecKey(t)
	swap(t, jwksFile, jwksOf(map[string]*ecdsa.PrivateKey{"a": keyA}))
	clock := &testClock{t: time.Now()}
	a, err := auth.NewJWTAuth(auth.JWTConfig{JWKSFile: jwksFile, KeyGrace: -1, Now: clock.now})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *gateway.Config) { c.Authenticate = a.Grant })
	tokA := sign(t, jwt.SigningMethodES256, keyA, "a", jwt.MapClaims{"exp": time.Now().Add(time.Hour).Unix()})
	swap(t, jwksFile, jwksOf(map[string]*ecdsa.PrivateKey{"b": keyB}))
	clock.add(auth.DefaultKeyCheckInterval)
	if admitted(t, e.wsURL(), tokA) {
		t.Error("a removed key still verifies without a grace period")
	}
}

// testClock is a clock the test moves.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d + time.Second)
}

func ecKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// jwksOf is a JWKS of the keys' public halves, by kid.
func jwksOf(keys map[string]*ecdsa.PrivateKey) string {
	pad := func(b []byte) []byte { return append(make([]byte, 32-len(b)), b...) }
	var list []map[string]string
	for kid, k := range keys {
		list = append(list, map[string]string{"kty": "EC", "kid": kid, "use": "sig", "crv": "P-256", "x": b64(pad(k.X.Bytes())), "y": b64(pad(k.Y.Bytes()))})
	}
	b, _ := json.Marshal(map[string]any{"keys": list})
	return string(b)
}

// swap replaces path's content by renaming a new file over it, as key
// rotation tooling (and a Kubernetes secret's symlink swap) does.
func swap(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// admitted dials a native WebSocket with tok: true when the gateway says
// ready, false when it closes the connection with 4401 (unauthorized).
func admitted(t *testing.T, wsURL, tok string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, wsURL+"?token="+tok, nil)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.CloseNow()
	_, msg, err := c.Read(ctx)
	if websocket.CloseStatus(err) == gateway.CloseUnauthorized {
		return false
	}
	if err != nil {
		t.Fatalf("first message: %v", err)
	}
	return strings.Contains(string(msg), `"ready"`)
}
