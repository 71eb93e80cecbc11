package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/fanwire/fanwire/gateway/internal/filter"

	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/fanwire/fanwire/subject"
)

// Grants is what an authenticated connection may do: the subject patterns
// it may subscribe to (a subscription's pattern must lie inside one of
// them) and publish to (a subject must match one of them), until Expires
// (zero: no expiry). A nil *Grants allows every subscription; publishing
// is never implied: nil or Anonymous grants publish only when
// the gateway's Config.AllowAnonymousPublish says so.
type Grants struct {
	Subscribe []string
	// SubscribeWhere is each Subscribe entry's row filter, a CEL
	// expression ("" none; nil: none has one): an entry written
	// {"subject": …, "where": …} grants only the events it accepts
	// (package filter).
	SubscribeWhere []string
	// Claims are the token's claims, as row filters see them ("claims").
	Claims  map[string]any
	Publish []string
	// Presence are the subjects (patterns) where the connection may track
	// itself as a member (the token's presence claim, as publish's).
	Presence  []string
	Expires   time.Time
	Subject   string // the token's sub, for logs
	Anonymous bool   // admitted without a token

	// PublishAsWritten is Publish as the token wrote it, before claims
	// were substituted: each token holding a {claim} is '*' (same order
	// and length as Publish; nil: Publish itself). The reserved-subject
	// rule looks at it (the gateway's publish).
	PublishAsWritten []string
}

// JWTConfig configures token authentication (see NewJWTAuth).
type JWTConfig struct {
	SecretFile string // HS256 shared secret (the file's bytes, trailing newline trimmed)
	JWKSFile   string // RS256/ES256 public keys, a JSON Web Key Set
	Issuer     string // when set, iss must equal it
	Audience   string // when set, aud must contain it
	Leeway     time.Duration
	// Now is the clock key checks and the grace of removed keys run by
	// (nil: time.Now).
	Now func() time.Time
	// KeyGrace is how long a key removed from SecretFile or JWKSFile
	// still verifies tokens once the change is seen (default
	// DefaultKeyGrace; negative: none, it stops at once). The files are
	// looked at on a verification, at most every KeyCheckInterval
	// (default DefaultKeyCheckInterval), and loaded again when changed.
	KeyGrace         time.Duration
	KeyCheckInterval time.Duration
	Logger           *zap.Logger
	// AllowAnonymous admits connections without a token, with
	// AnonymousGrants.
	AllowAnonymous  bool
	AnonymousGrants []string
}

// JWTAuth verifies connection tokens (JWTs) and turns their claims into
// grants. Tokens come from an "Authorization: Bearer" header, a ?token=
// query parameter (browsers cannot set headers on a WebSocket), or the
// GraphQL connection_init payload's "token" (or "authToken",
// "Authorization") field.
//
// Grants come from the token's "subscribe" and "publish" claims, lists of
// subject patterns in which {name} is replaced by the token's string claim
// name ({sub}, {tenant}, …): "orders.{tenant}.>" keeps tenants apart. A
// pattern whose placeholder has no string claim (or one that is not a
// single subject token) is dropped, never widened.
//
// The keys are loaded again when their files change, and a removed key
// keeps verifying for a grace period (see tokenKeys).
type JWTAuth struct {
	cfg    JWTConfig
	keys   *tokenKeys // the secret and the JWKS's keys, reloaded
	parser *jwt.Parser
}

// NewJWTAuth loads the keys. At least one of SecretFile and JWKSFile is
// needed.
func NewJWTAuth(cfg JWTConfig) (*JWTAuth, error) {
	if cfg.SecretFile == "" && cfg.JWKSFile == "" {
		return nil, errors.New("jwt: give a secret file (HS256) or a JWKS file (RS256/ES256)")
	}
	if cfg.KeyGrace == 0 {
		cfg.KeyGrace = DefaultKeyGrace
	}
	if cfg.KeyCheckInterval <= 0 {
		cfg.KeyCheckInterval = DefaultKeyCheckInterval
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	a := &JWTAuth{cfg: cfg, keys: &tokenKeys{secretFile: cfg.SecretFile, jwksFile: cfg.JWKSFile,
		every: cfg.KeyCheckInterval, grace: cfg.KeyGrace, log: cfg.Logger, now: cfg.Now}}
	if err := a.keys.load(); err != nil {
		return nil, err
	}
	methods := []string{}
	if cfg.SecretFile != "" {
		methods = append(methods, "HS256")
	}
	if cfg.JWKSFile != "" {
		methods = append(methods, "RS256", "ES256")
	}
	if a.cfg.Leeway == 0 {
		a.cfg.Leeway = 30 * time.Second
	}
	opts := []jwt.ParserOption{jwt.WithValidMethods(methods), jwt.WithLeeway(a.cfg.Leeway), jwt.WithExpirationRequired()}
	if cfg.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(cfg.Issuer))
	}
	if cfg.Audience != "" {
		opts = append(opts, jwt.WithAudience(cfg.Audience))
	}
	a.parser = jwt.NewParser(opts...)
	return a, nil
}

// Collectors export the key files' reloads,
// fanwire_file_reloads_total{file="jwt_secret"|"jwks",result}: register
// them on the role's registry.
func (a *JWTAuth) Collectors() []prometheus.Collector { return a.keys.collectors() }

func (a *JWTAuth) keyFunc(t *jwt.Token) (any, error) {
	kid, _ := t.Header["kid"].(string)
	return a.keys.keyFor(t.Method.Alg(), kid)
}

// ErrNoToken is returned when a connection brings no token and anonymous
// connections are not allowed.
var ErrNoToken = errors.New("a token is required (Authorization: Bearer, ?token=, or the GraphQL connection_init payload's token)")

// tokenFrom finds a connection's token.
func tokenFrom(r *http.Request, payload json.RawMessage) string {
	if len(payload) > 0 {
		var p map[string]any
		if json.Unmarshal(payload, &p) == nil {
			for _, k := range []string{"token", "authToken", "Authorization", "authorization"} {
				if s, ok := p[k].(string); ok && s != "" {
					return strings.TrimPrefix(strings.TrimPrefix(s, "Bearer "), "bearer ")
				}
			}
		}
	}
	if h := r.Header.Get("Authorization"); h != "" {
		if t, ok := strings.CutPrefix(h, "Bearer "); ok {
			return strings.TrimSpace(t)
		}
	}
	return r.URL.Query().Get("token")
}

// Grant authenticates a connection: it verifies its token and returns its
// grants, or refuses it.
func (a *JWTAuth) Grant(ctx context.Context, r *http.Request, payload json.RawMessage) (*Grants, error) {
	raw := tokenFrom(r, payload)
	if raw == "" {
		if a.cfg.AllowAnonymous {
			return &Grants{Subscribe: a.cfg.AnonymousGrants, Subject: "anonymous", Anonymous: true}, nil
		}
		return nil, ErrNoToken
	}
	claims := jwt.MapClaims{}
	if _, err := a.parser.ParseWithClaims(raw, claims, a.keyFunc); err != nil {
		return nil, fmt.Errorf("token: %w", err)
	}
	g := &Grants{}
	g.Subject, _ = claims["sub"].(string)
	if exp, err := claims.GetExpirationTime(); err == nil && exp != nil {
		g.Expires = exp.Time
	}
	g.Subscribe, g.SubscribeWhere = subscribeGrants(claims)
	g.Claims = filter.NormalizeJSON(map[string]any(claims)).(map[string]any)
	g.Publish, g.PublishAsWritten = claimPatterns(claims, "publish")
	g.Presence, _ = claimPatterns(claims, "presence")
	return g, nil
}

// claimPatterns reads the list claim name as subject patterns, with
// {claim} placeholders substituted, and each as written (writtenPattern);
// entries that are not strings, lose a placeholder or are not valid
// patterns are dropped.
func claimPatterns(claims jwt.MapClaims, name string) (out, written []string) {
	list, _ := claims[name].([]any)
	for _, v := range list {
		raw, ok := v.(string)
		if !ok {
			continue
		}
		if p, ok := substituteClaims(raw, claims); ok && subject.ValidatePattern(p) == nil {
			out = append(out, p)
			written = append(written, writtenPattern(raw))
		}
	}
	return out, written
}

// subscribeGrants reads the subscribe claim: patterns as claimPatterns
// does, and entries written {"subject": pattern, "where": filter} (a row
// filter in CEL, with the token's claims as claims.*: typed values, never
// spliced into the text). An object with another key, a where that is
// not a non-empty string, or a pattern claimPatterns would drop, is
// dropped: an entry is never widened.
func subscribeGrants(claims jwt.MapClaims) (patterns, where []string) {
	list, _ := claims["subscribe"].([]any)
	filtered := false
	for _, v := range list {
		raw, w := "", ""
		switch e := v.(type) {
		case string:
			raw = e
		case map[string]any:
			s, okS := e["subject"].(string)
			f, okW := e["where"].(string)
			if !okS || !okW || strings.TrimSpace(f) == "" || len(e) != 2 {
				continue
			}
			raw, w = s, f
			filtered = true
		default:
			continue
		}
		if p, ok := substituteClaims(raw, claims); ok && subject.ValidatePattern(p) == nil {
			patterns = append(patterns, p)
			where = append(where, w)
		}
	}
	if !filtered {
		where = nil
	}
	return patterns, where
}

var placeholderRE = regexp.MustCompile(`\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// substituteClaims replaces each {name} in pattern by the string claim
// name. It fails when a claim is missing, not a string, or not a valid
// single subject token (it would widen or split the pattern).
func substituteClaims(pattern string, claims jwt.MapClaims) (string, bool) {
	ok := true
	out := placeholderRE.ReplaceAllStringFunc(pattern, func(m string) string {
		v, isStr := claims[m[1:len(m)-1]].(string)
		if !isStr || v == "" || strings.ContainsAny(v, ".*> \t\r\n") {
			ok = false
			return m
		}
		return v
	})
	return out, ok
}

// Allows reports whether the grants admit a subscription to pattern.
func (g *Grants) Allows(pattern string) bool {
	if g == nil {
		return true
	}
	for _, p := range g.Subscribe {
		if subject.Contains(p, pattern) {
			return true
		}
	}
	return false
}

// Authenticator decides whether a connection may proceed, and what it may
// subscribe to (nil grants: everything), on both protocols: for GraphQL it
// is called with the connection_init payload (JSON, nil when absent) and
// the upgrade request, and an error closes the connection with 4403; for
// the native protocol, which has no init message, with the upgrade request
// and a nil payload, and an error closes the connection with 4401 right
// after the upgrade.
// JWTAuth.Grant is one.
type Authenticator func(ctx context.Context, r *http.Request, initPayload json.RawMessage) (*Grants, error)

// FilterText is the row filter of the grants covering pattern: "" when
// one covering entry has none (the pattern is granted unfiltered), else the
// disjunction of the covering entries' filters.
func FilterText(g *Grants, pattern string) string {
	if g == nil {
		return ""
	}
	var parts []string
	for i, p := range g.Subscribe {
		if !subject.Contains(p, pattern) {
			continue
		}
		w := ""
		if i < len(g.SubscribeWhere) {
			w = g.SubscribeWhere[i]
		}
		if w == "" {
			return ""
		}
		parts = append(parts, w)
	}
	switch len(parts) {
	case 0:
		return ""
	case 1:
		return parts[0]
	}
	slices.Sort(parts)
	parts = slices.Compact(parts)
	if len(parts) == 1 {
		return parts[0]
	}
	return "(" + strings.Join(parts, ") || (") + ")"
}

// writtenPattern is a publish pattern as the token wrote it, each token
// holding a {claim} placeholder made a '*': what the issuer named,
// whatever a claim later put there. A pattern without placeholders is
// itself.
func writtenPattern(p string) string {
	if !strings.Contains(p, "{") {
		return p
	}
	toks := strings.Split(p, ".")
	for i, tok := range toks {
		if placeholderRE.MatchString(tok) {
			toks[i] = "*"
		}
	}
	return strings.Join(toks, ".")
}
