package redact_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/fanwire/fanwire/redact"
)

// TestURLHidesEveryCredentialForm: URLs with and without a scheme,
// parsable or not, lists, query credentials and keyword DSNs keep their
// host and lose their secret.
func TestURLHidesEveryCredentialForm(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		token    bool
		secrets  []string
	}{
		{"nats://admin:s3cret@h:4222", "nats://admin:xxxxx@h:4222", true, []string{"s3cret"}},
		{"admin:s3cretA@h:1", "admin:xxxxx@h:1", true, []string{"s3cretA"}},
		{"nats://tok3n@h:1,nats://u:p4ss@h2:1", "nats://xxxxx@h:1,nats://u:xxxxx@h2:1", true, []string{"tok3n", "p4ss"}},
		{"tok3n@h:1", "xxxxx@h:1", true, []string{"tok3n"}},
		{"redis://:s3cret/B%x@h:1", "redis://:xxxxx@h:1", false, []string{"s3cret/B%x"}},
		{"redis://u:p@ss#w?rd@h:1/0", "redis://u:xxxxx@h:1/0", false, []string{"p@ss#w?rd"}},
		{"redis://u@h:1", "redis://u@h:1", false, nil},
		{"postgres://u@h/db?sslmode=disable&password=s3cretQ", "postgres://u@h/db?sslmode=disable&password=xxxxx", false, []string{"s3cretQ"}},
		{"host=h port=1 password=s3cretK user=u", "host=h port=1 password=xxxxx user=u", false, []string{"s3cretK"}},
		{"host=h password = 's3c ret\\' L' user=u", "host=h password = xxxxx user=u", false, []string{"'s3c ret\\' L'", "s3c ret' L"}},
		{"redis://h:6379", "redis://h:6379", false, nil},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got := redact.URL(tc.in)
			if tc.token {
				got = redact.NATSURL(tc.in)
			}
			if got != tc.want {
				t.Errorf("redacted %q, want %q", got, tc.want)
			}
			if s := redact.Secrets(tc.in, tc.token); fmt.Sprint(s) != fmt.Sprint(tc.secrets) {
				t.Errorf("secrets %q, want %q", s, tc.secrets)
			}
		})
	}
}

// TestScrubberFindsEncodedForms: a secret is masked as given, URL-encoded,
// decoded, %q-quoted and inside a JSON log field.
func TestScrubberFindsEncodedForms(t *testing.T) {
	secret := `s3c"ret/B%2Fx\y`
	decoded, _ := url.PathUnescape(secret)
	q := fmt.Sprintf("%q", "redis://:"+secret+"@h")
	js, _ := json.Marshal(map[string]string{"error": q})
	s := redact.NewScrubber(secret, "", "ab")
	for _, text := range []string{secret, url.QueryEscape(secret), url.PathEscape(secret), decoded, q, string(js)} {
		got := s.String("before " + text + " after")
		for _, form := range []string{secret, url.QueryEscape(secret), decoded, "s3c"} {
			if strings.Contains(got, form) {
				t.Errorf("%q scrubbed to %q: still holds %q", text, got, form)
			}
		}
		if !strings.Contains(got, "before") || !strings.Contains(got, "after") {
			t.Errorf("%q scrubbed to %q", text, got)
		}
	}
	if got := s.String("tab"); got != "tab" {
		t.Errorf("a secret shorter than MinSecret masks %q to %q", "tab", got)
	}
	var buf bytes.Buffer
	w := s.Writer(&buf)
	s.Add("latekey")
	if _, err := fmt.Fprintf(w, "key latekey and %s\n", secret); err != nil {
		t.Fatal(err)
	}
	if got := buf.String(); got != "key xxxxx and xxxxx\n" {
		t.Errorf("writer wrote %q", got)
	}
}
