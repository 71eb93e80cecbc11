package gateway

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/fanwire/fanwire/subject"
)

// checkPublishFrame checks an accepted publish frame: a usable id, a
// subject, data that is valid JSON, and no field of another type.
func checkPublishFrame(t testing.TB, data []byte, fr clientFrame) {
	t.Helper()
	if fr.ID == nil || *fr.ID == "" || len(*fr.ID) > maxIDLen || fr.Subject == nil || fr.Data == nil {
		t.Fatalf("accepted publish without a usable id, a subject and data: %q", data)
	}
	if fr.From != nil || fr.Durable != nil || fr.Token != nil {
		t.Fatalf("accepted publish with a field of another type: %q", data)
	}
	if !json.Valid(fr.Data) {
		t.Fatalf("accepted publish whose data is not JSON: %q", data)
	}
}

// fuzzPublishers are the credentials FuzzPublishFrame checks each subject
// against, with the subjects they may reach beyond the reserved db.>.
var fuzzPublishers = []publisher{
	anonymousPublisher,
	{name: "key anywhere", anywhere: true},
	{name: "key orders", patterns: []string{"orders.>"}},
	{name: "key everything", patterns: []string{">"}},
	{name: "key db audit", patterns: []string{"db.audit.>", "app.*"}},
	{name: "key star", patterns: []string{"*.orders.>"}},
	{name: "token without grant"},
}

// FuzzPublishFrame feeds arbitrary client frames through the publish
// path's parsing and checks: parseClientFrame never panics, and for an
// accepted publish checkPublish never lets a wildcard, an invalid subject,
// a subject outside the space or a reserved subject through unless the
// rules allow it (a reserved subject only through a pattern inside the
// reserved space that matches it), and every reply is valid JSON that
// carries the message's id.
func FuzzPublishFrame(f *testing.F) {
	for _, s := range []string{
		`{"type":"publish","id":"p1","subject":"orders.1","data":{"n":1}}`,
		`{"type":"publish","id":"p1","subject":"db.orders.1","data":{"status":"refunded"}}`,
		`{"type":"publish","id":"p1","subject":"db.audit.1","data":[1,2]}`,
		`{"type":"publish","id":"p1","subject":"db.%errors.orders","data":null}`,
		`{"type":"publish","id":"p1","subject":"db","data":"x"}`,
		`{"type":"publish","id":"p1","subject":"orders.*","data":1}`,
		`{"type":"publish","id":"p1","subject":"orders.>","data":1}`,
		`{"type":"publish","id":"p1","subject":"orders..1","data":1}`,
		`{"type":"publish","id":"p1","subject":"","data":1}`,
		`{"type":"publish","id":"p1","subject":"x.orders.1","data":true}`,
		`{"type":"publish","id":"\u00e9\ud83d\ude00","subject":"app.\u00e9","data":"\ud800"}`,
		`{"type":"publish","id":"p1","subject":"orders.1"}`,
		`{"type":"publish","id":"p1","data":1}`,
		`{"type":"publish","subject":"orders.1","data":1}`,
		`{"type":"publish","id":"` + strings.Repeat("i", maxIDLen+1) + `","subject":"a","data":1}`,
		`{"type":"publish","id":"p1","subject":"orders.1","data":1,"from":"first"}`,
		`{"type":"publish","id":"p1","subject":"orders.1","data":{"a":` + strings.Repeat("[", 64) + strings.Repeat("]", 64) + `}}`,
		`{"type":"publish","id":"p1","subject":"orders.1","data":1}{}`,
		`{"type":"publish","id":"p1","subject":"orders.1","data":01}`,
		`{"type":"publish","id":5,"subject":"orders.1","data":1}`,
	} {
		f.Add([]byte(s))
	}
	s := &Server{cfg: Config{Subjects: []string{"orders.>", "app.>", "db.>", "x.>"}, ReservedSubjects: []string{"db.>"}}}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := parseClientFrame(data)
		if err != nil {
			checkErrorMessage(t, fr, err)
			return
		}
		if fr.Type != "publish" {
			return
		}
		checkPublishFrame(t, data, fr)
		subj := *fr.Subject
		for _, p := range fuzzPublishers {
			ref := s.checkPublish(p, subj)
			if ref != nil {
				if ref.code != CodeBadSubject && ref.code != CodeForbidden {
					t.Fatalf("%s, %q: refusal code %q", p.name, subj, ref.code)
				}
				if !utf8.ValidString(ref.msg) && utf8.ValidString(subj) {
					t.Fatalf("%s, %q: refusal message is not UTF-8", p.name, subj)
				}
				if r := errorMessage(*fr.ID, ref.code, ref.msg); !json.Valid(r) {
					t.Fatalf("error reply %q is not valid JSON", r)
				}
				continue
			}
			if subject.Validate(subj) != nil || s.inSubjectSpace(subj) != nil {
				t.Fatalf("%s may publish to %q: not a valid subject of the space", p.name, subj)
			}
			if subject.Match("db.>", subj) {
				explicit := false
				for _, pat := range p.patterns {
					explicit = explicit || (subject.Match(pat, subj) && subject.Contains("db.>", pat))
				}
				if !explicit {
					t.Fatalf("%s may publish to the reserved %q without a pattern inside db.>", p.name, subj)
				}
			}
			if r := publishedMessage(*fr.ID, "js:1"); !json.Valid(r) {
				t.Fatalf("published reply %q is not valid JSON", r)
			}
		}
	})
}
