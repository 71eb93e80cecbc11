package auth

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fanwire/fanwire/gateway/internal/reload"
	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// DefaultKeyCheckInterval is how often, at most, JWTAuth looks at its key
// files: a stat of each on a token's verification, as tlscert.Files does on a
// handshake.
const DefaultKeyCheckInterval = 2 * time.Second

// DefaultKeyGrace is how long a key removed from the key files still
// verifies tokens (JWTConfig.KeyGrace): tokens an issuer signed just
// before it rotated keep working until they are refreshed.
const DefaultKeyGrace = 10 * time.Minute

// tokenKeys holds the keys that verify tokens, and loads them again when
// their files change. It is stat-based, on the verification path, at most
// every check interval (no goroutine to own; a flood of bad tokens costs
// at most one stat of each file per interval, and a re-read only when a
// file changed) rather than a reload on a verification failure, which a
// client could order with tokens naming unknown key ids. A key the new
// files no longer hold is retired: it still verifies for the grace
// period, then stops. A file that does not load keeps the keys in force,
// is logged and counted, and is tried again at every check (package reload).
type tokenKeys struct {
	secretFile, jwksFile string        // static
	every, grace         time.Duration // static
	log                  *zap.Logger   // static
	now                  func() time.Time
	secretCounts         reload.Counts
	jwksCounts           reload.Counts

	mu      sync.Mutex
	secret  []byte         // guarded by mu: the HS256 secret (nil: none)
	kids    map[string]any // guarded by mu: kid → *rsa.PublicKey or *ecdsa.PublicKey
	anyKeys []any          // guarded by mu: keys without a kid
	retired []retiredKey   // guarded by mu: removed keys within their grace
	watch   [2]watchedFile // guarded by mu: the secret file, the JWKS file
	checked time.Time      // guarded by mu: last look at the files
}

// retiredKey is a key the files no longer hold, verifying until until.
type retiredKey struct {
	kid   string // "" for a key without one; the secret has none
	key   any    // []byte (HS256) or a public key
	until time.Time
}

// watchedFile is one key file's reload state.
type watchedFile struct {
	loaded []reload.Stamp // as it was when last loaded
	failed string         // the last failure logged ("": it loads)
}

// load reads the files for the first time: an error names the file.
func (k *tokenKeys) load() error {
	if k.secretFile != "" {
		s, err := readSecret(k.secretFile)
		if err != nil {
			return err
		}
		k.secret = s
		k.watch[0].loaded, _ = reload.Stat(k.secretFile)
	}
	if k.jwksFile != "" {
		kids, anyKeys, err := readJWKS(k.jwksFile)
		if err != nil {
			return err
		}
		k.kids, k.anyKeys = kids, anyKeys
		k.watch[1].loaded, _ = reload.Stat(k.jwksFile)
	}
	k.checked = k.now()
	return nil
}

// collectors export the reloads' outcomes.
func (k *tokenKeys) collectors() []prometheus.Collector {
	var cs []prometheus.Collector
	if k.secretFile != "" {
		cs = append(cs, reload.NewCollector("jwt_secret", &k.secretCounts))
	}
	if k.jwksFile != "" {
		cs = append(cs, reload.NewCollector("jwks", &k.jwksCounts))
	}
	return cs
}

// keyFor returns what verifies a token signed with alg and kid: one key,
// or a jwt.VerificationKeySet of the keys in force and the retired ones
// still within their grace.
func (k *tokenKeys) keyFor(alg, kid string) (any, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.now()
	if now.Sub(k.checked) >= k.every {
		k.checked = now
		k.reloadLocked(now)
	}
	var keys []any
	if alg == "HS256" {
		if k.secret != nil {
			keys = append(keys, k.secret)
		}
		for _, r := range k.retired {
			if s, ok := r.key.([]byte); ok && now.Before(r.until) {
				keys = append(keys, s)
			}
		}
		if len(keys) == 0 {
			return nil, errors.New("HS256 is not configured")
		}
		return keySet(keys), nil
	}
	if key, ok := k.kids[kid]; ok {
		keys = append(keys, key)
	}
	for _, r := range k.retired {
		if r.kid != "" && r.kid == kid && now.Before(r.until) {
			keys = append(keys, r.key)
		}
	}
	if len(keys) == 0 {
		for _, key := range k.anyKeys {
			if algFits(alg, key) {
				keys = append(keys, key)
			}
		}
		for _, r := range k.retired {
			if r.kid == "" && algFits(alg, r.key) && now.Before(r.until) {
				keys = append(keys, r.key)
			}
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("no key for kid %q", kid)
	}
	return keySet(keys), nil
}

// keySet is the one key, or the set the parser tries in turn.
func keySet(keys []any) any {
	if len(keys) == 1 {
		return keys[0]
	}
	set := jwt.VerificationKeySet{Keys: make([]jwt.VerificationKey, len(keys))}
	for i, key := range keys {
		set.Keys[i] = key
	}
	return set
}

func algFits(alg string, key any) bool {
	switch key.(type) {
	case *rsa.PublicKey:
		return alg == "RS256"
	case *ecdsa.PublicKey:
		return alg == "ES256"
	}
	return false
}

// reloadLocked loads each key file that differs from the one last
// loaded, retires the keys it no longer holds, and drops retired keys
// past their grace.
func (k *tokenKeys) reloadLocked(now time.Time) {
	k.retired = slices.DeleteFunc(k.retired, func(r retiredKey) bool { return !now.Before(r.until) })
	if k.secretFile != "" {
		k.reloadFile(&k.watch[0], k.secretFile, "jwt secret", &k.secretCounts, func() error {
			s, err := readSecret(k.secretFile)
			if err != nil {
				return err
			}
			if !bytes.Equal(s, k.secret) {
				k.retire("", k.secret, now)
				k.unretire(func(r retiredKey) bool { b, ok := r.key.([]byte); return ok && bytes.Equal(b, s) })
				k.secret = s
			}
			return nil
		})
	}
	if k.jwksFile != "" {
		k.reloadFile(&k.watch[1], k.jwksFile, "jwks", &k.jwksCounts, func() error {
			kids, anyKeys, err := readJWKS(k.jwksFile)
			if err != nil {
				return err
			}
			for kid, old := range k.kids {
				if key, ok := kids[kid]; !ok || !sameKey(key, old) {
					k.retire(kid, old, now)
				}
			}
			for _, old := range k.anyKeys {
				if !containsKey(anyKeys, old) {
					k.retire("", old, now)
				}
			}
			k.unretire(func(r retiredKey) bool {
				if r.kid != "" {
					key, ok := kids[r.kid]
					return ok && sameKey(key, r.key)
				}
				return containsKey(anyKeys, r.key)
			})
			k.kids, k.anyKeys = kids, anyKeys
			return nil
		})
	}
}

// reloadFile runs load when path differs from its last load.
func (k *tokenKeys) reloadFile(w *watchedFile, path, what string, counts *reload.Counts, load func() error) {
	stamps, err := reload.Stat(path)
	if err == nil && reload.Same(stamps, w.loaded) {
		w.failed = ""
		return
	}
	if err == nil {
		err = load()
	}
	if err != nil {
		counts.Failed.Add(1)
		if msg := reload.ErrString(err); msg != w.failed {
			w.failed = msg
			k.log.Warn(what+" file changed but does not load: keeping the keys in force, trying again at every check", zap.String("file", path), zap.Error(err))
		}
		return
	}
	w.loaded, w.failed = stamps, ""
	counts.OK.Add(1)
	k.log.Info(what+" file reloaded", zap.String("file", path), zap.Duration("grace", k.grace))
}

// retire keeps key verifying for the grace period (none: not at all).
func (k *tokenKeys) retire(kid string, key any, now time.Time) {
	if key == nil || k.grace <= 0 {
		return
	}
	if s, ok := key.([]byte); ok && s == nil {
		return
	}
	k.retired = append(k.retired, retiredKey{kid: kid, key: key, until: now.Add(k.grace)})
}

// unretire drops retired keys that are in force again.
func (k *tokenKeys) unretire(inForce func(retiredKey) bool) {
	k.retired = slices.DeleteFunc(k.retired, inForce)
}

func sameKey(a, b any) bool {
	ea, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ea.Equal(b)
}

func containsKey(keys []any, key any) bool {
	for _, k := range keys {
		if sameKey(k, key) {
			return true
		}
	}
	return false
}

// readSecret reads an HS256 secret file: its bytes, trailing newline
// trimmed, at least 32 of them.
func readSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("jwt secret: %w", err)
	}
	s := []byte(strings.TrimRight(string(b), "\r\n"))
	if len(s) < 32 {
		return nil, fmt.Errorf("jwt secret %s: %d bytes; use at least 32", path, len(s))
	}
	return s, nil
}

// jwk is the subset of a JSON Web Key the gateway reads.
type jwk struct {
	Kty string `json:"kty"`
	Kid string `json:"kid"`
	Use string `json:"use"`
	N   string `json:"n"`
	E   string `json:"e"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Y   string `json:"y"`
}

// readJWKS reads a JSON Web Key Set's signing keys, by kid and without.
func readJWKS(path string) (kids map[string]any, anyKeys []any, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("jwks: %w", err)
	}
	var set struct {
		Keys []jwk `json:"keys"`
	}
	if err := json.Unmarshal(b, &set); err != nil {
		return nil, nil, fmt.Errorf("jwks %s: %w", path, err)
	}
	kids = make(map[string]any)
	for i, k := range set.Keys {
		if k.Use != "" && k.Use != "sig" {
			continue
		}
		pub, err := k.publicKey()
		if err != nil {
			return nil, nil, fmt.Errorf("jwks %s: key %d (kid %q): %w", path, i, k.Kid, err)
		}
		if k.Kid == "" {
			anyKeys = append(anyKeys, pub)
		} else {
			kids[k.Kid] = pub
		}
	}
	if len(kids)+len(anyKeys) == 0 {
		return nil, nil, fmt.Errorf("jwks %s: no signing key", path)
	}
	return kids, anyKeys, nil
}

func b64int(s string) (*big.Int, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, err
	}
	return new(big.Int).SetBytes(b), nil
}

func (k jwk) publicKey() (any, error) {
	switch k.Kty {
	case "RSA":
		n, err := b64int(k.N)
		if err != nil {
			return nil, fmt.Errorf("n: %w", err)
		}
		e, err := b64int(k.E)
		if err != nil || !e.IsInt64() {
			return nil, fmt.Errorf("e: bad exponent")
		}
		return &rsa.PublicKey{N: n, E: int(e.Int64())}, nil
	case "EC":
		if k.Crv != "P-256" {
			return nil, fmt.Errorf("curve %q: ES256 needs P-256", k.Crv)
		}
		x, err1 := b64int(k.X)
		y, err2 := b64int(k.Y)
		if err1 != nil || err2 != nil {
			return nil, errors.New("bad x or y")
		}
		pub := &ecdsa.PublicKey{Curve: elliptic.P256(), X: x, Y: y}
		if !pub.Curve.IsOnCurve(x, y) { //nolint:staticcheck // validating an imported point
			return nil, errors.New("the point is not on P-256")
		}
		return pub, nil
	}
	return nil, fmt.Errorf("key type %q: use RSA or EC", k.Kty)
}
