package broker

import (
	"net/url"
	"strings"
)

// redactURL hides a URL's password, for error messages; a list of URLs
// (comma-separated, as NATS takes them) is redacted one by one.
func redactURL(s string) string {
	if strings.Contains(s, ",") {
		parts := strings.Split(s, ",")
		for i, p := range parts {
			parts[i] = redactURL(strings.TrimSpace(p))
		}
		return strings.Join(parts, ",")
	}
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
