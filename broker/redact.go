package broker

import (
	"errors"
	"net/url"

	"github.com/fanwire/fanwire/redact"
)

// redactedError is a client library's error with the credentials of the
// URL it was given masked in its message; errors.Is and errors.As still
// see the library's error.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// redactErr masks the credentials of rawURL (a URL list; token: a lone
// user is a NATS token) in err's message. A URL that did not parse loses
// the parser's detail, which quotes the URL or a piece of it (`invalid
// port ":s3cret" after host` for a password holding a '/'), for a hint.
func redactErr(err error, rawURL string, token bool) error {
	if err == nil {
		return nil
	}
	secrets := redact.Secrets(rawURL, token)
	if len(secrets) == 0 {
		return err
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return &redactedError{msg: "the URL does not parse (a password holding '/', '#', '?', '@' or '%' must be percent-encoded, e.g. '/' as %2F)", err: err}
	}
	return &redactedError{msg: redact.NewScrubber(secrets...).String(err.Error()), err: err}
}
