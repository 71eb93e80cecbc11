package main

import (
	"flag"

	"github.com/fanwire/fanwire/redact"
)

// How a flag holds a credential (see markSecret).
type secretKind int

const (
	secretValue   secretKind = iota // the value is the secret (--api-key)
	secretURL                       // URLs or a DSN: the password, credential query parameters
	secretNATSURL                   // NATS URLs: also a lone user (a token)
)

// markSecret says that flags names hold credentials: their values are
// never printed (a bad FANWIRE_* value is named, not quoted), and once the
// flags are parsed the command's scrubber masks them in every log line and
// error it writes.
func (c *command) markSecret(kind secretKind, names ...string) {
	if c.secretFlags == nil {
		c.secretFlags = map[string]secretKind{}
	}
	for _, n := range names {
		c.secretFlags[n] = kind
	}
}

// isSecret reports whether flag name holds a credential.
func (c *command) isSecret(name string) bool {
	_, ok := c.secretFlags[name]
	return ok
}

// scrubSecrets (re)builds c.scrub from the secret flags' values.
func (c *command) scrubSecrets() {
	var secrets []string
	c.fs.VisitAll(func(f *flag.Flag) {
		kind, ok := c.secretFlags[f.Name]
		if !ok {
			return
		}
		v := f.Value.String()
		switch kind {
		case secretValue:
			secrets = append(secrets, v)
		default:
			secrets = append(secrets, redact.Secrets(v, kind == secretNATSURL)...)
		}
	})
	c.scrub = redact.NewScrubber(secrets...)
}

// brokerSecrets marks the broker flags that hold credentials.
func (c *command) brokerSecrets() {
	c.markSecret(secretNATSURL, "nats-url")
	c.markSecret(secretURL, "redis-url")
}
