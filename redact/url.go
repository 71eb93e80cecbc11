package redact

import (
	"regexp"
	"strings"
)

// Mask stands in for a credential.
const Mask = "xxxxx"

// URL returns s, a server URL or a comma-separated list of them, or a
// PostgreSQL keyword/value DSN, with every credential in it replaced by
// Mask: the password of user:password@ (the user stays), query parameters
// named like a credential (password=, token=, secret=), a keyword DSN's
// password=. It does not parse s as a URL: a password holding '/', '#',
// '?', '@' or a bad %-escape makes a URL unparsable or parse wrong, and a
// URL without a scheme ("user:pass@host:4222") parses as scheme "user".
// Everything before the last '@' counts as the user information instead,
// which hides too much in the rare URL whose path or query holds an '@',
// never too little.
func URL(s string) string { return redactList(s, false) }

// NATSURL is URL for NATS server URLs, where a user without a password
// ("nats://token@host") is an authentication token: it is masked too.
func NATSURL(s string) string { return redactList(s, true) }

func redactList(s string, token bool) string {
	if isKeywordDSN(s) {
		return keywordSecretRE.ReplaceAllString(s, "${1}"+Mask)
	}
	parts := strings.Split(s, ",")
	for i, p := range parts {
		parts[i] = redactOne(p, token)
	}
	return strings.Join(parts, ",")
}

func redactOne(p string, token bool) string {
	scheme, rest := splitScheme(p)
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		user, pass, hasPass := strings.Cut(rest[:at], ":")
		switch {
		case hasPass && pass != "":
			rest = user + ":" + Mask + rest[at:]
		case !hasPass && token && user != "":
			rest = Mask + rest[at:]
		}
	}
	return scheme + querySecretRE.ReplaceAllString(rest, "${1}"+Mask)
}

// Secrets returns the credentials in s (a URL list or DSN, as for URL; a
// lone user is a token when token is set), for a Scrubber.
func Secrets(s string, token bool) []string {
	if isKeywordDSN(s) {
		var out []string
		for _, m := range keywordSecretRE.FindAllStringSubmatch(s, -1) {
			v := m[2]
			if len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'' {
				out = append(out, v, strings.ReplaceAll(strings.ReplaceAll(v[1:len(v)-1], `\'`, `'`), `\\`, `\`))
			} else {
				out = append(out, v)
			}
		}
		return out
	}
	var out []string
	for _, p := range strings.Split(s, ",") {
		_, rest := splitScheme(p)
		if at := strings.LastIndexByte(rest, '@'); at >= 0 {
			user, pass, hasPass := strings.Cut(rest[:at], ":")
			switch {
			case hasPass && pass != "":
				out = append(out, pass)
			case !hasPass && token && user != "":
				out = append(out, user)
			}
		}
		for _, m := range querySecretRE.FindAllStringSubmatch(rest, -1) {
			out = append(out, m[2])
		}
	}
	return out
}

// splitScheme cuts "scheme://" off p; a p without one has none.
func splitScheme(p string) (scheme, rest string) {
	if i := strings.Index(p, "://"); i >= 0 {
		return p[:i+3], p[i+3:]
	}
	return "", p
}

// isKeywordDSN reports whether s is a PostgreSQL keyword/value string
// ("host=h user=u password=p"): no scheme, and a keyword= before any '@'.
func isKeywordDSN(s string) bool {
	if strings.Contains(s, "://") {
		return false
	}
	return keywordRE.MatchString(s)
}

var (
	keywordRE = regexp.MustCompile(`^\s*[A-Za-z_]+\s*=`)
	// keywordSecretRE finds a keyword DSN's password values: quoted
	// ('it''s' style with backslash escapes) or up to the next space.
	keywordSecretRE = regexp.MustCompile(`(?i)(\b(?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'|[^\s']\S*)`)
	// querySecretRE finds URL query parameters named like a credential.
	querySecretRE = regexp.MustCompile(`(?i)([?&;](?:[a-z_]*(?:pass|secret|token)[a-z_]*)=)([^&#]*)`)
)
