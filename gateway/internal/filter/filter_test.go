package filter

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestFilterCompileErrorsNamePosition(t *testing.T) {
	ec := NewCache(10_000, nil)
	for _, tc := range []struct{ expr, want string }{
		{"doc.status == ", "1:15"},
		{"doc.status = 'open'", "1:12"},
		{"nosuch.x == 1", "undeclared reference to 'nosuch'"},
		{"doc.total + 1", "not a bool"},
		{"doc.total", ""}, // dyn: accepted at compile time, rejected per event unless a bool
		{"1 + 1", "not a bool"},
		{"", "empty"},
		{strings.Repeat("a", maxWhereLen+1), "over"},
	} {
		_, err := ec.Compile(tc.expr)
		if tc.want == "" {
			if err != nil {
				t.Errorf("%q: %v", tc.expr, err)
			}
			continue
		}
		if !errors.Is(err, ErrBadFilter) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one naming %q", tc.expr, err, tc.want)
		}
	}
}

func TestFilterEvaluatesJSONAsUsersWriteIt(t *testing.T) {
	ec := NewCache(10_000, nil)
	data := `{"op":"update","key":7,"doc":{"id":7,"status":"open","total":120.5,"qty":3,"customer_id":42,"tags":["a","b"],"note":null,"big":12345678901234567890,"addr":{"city":"Oslo"}}}`
	p := Parse("db.orders.7", []byte(data), false)
	for _, tc := range []struct {
		expr string
		want bool
	}{
		{"doc.status == 'open' && doc.total > 100", true},
		{"doc.total > 100", true},
		{"doc.qty == 3", true},
		{"doc.qty == 3.0", true},
		{"doc.qty < 3.5", true},
		{"doc.customer_id == 42", true},
		{"doc.customer_id == 43", false},
		{"'a' in doc.tags", true},
		{"doc.tags.exists(t, t == 'b')", true},
		{"doc.note == null", true},
		{"doc.missing == 1", false}, // an error is a rejection
		{"has(doc.missing)", false},
		{"doc.addr.city.startsWith('Os')", true},
		{"op == 'update' && subject == 'db.orders.7'", true},
		{"data.key == 7", true},
		{"doc.big > 1.0", true},
		{"doc.total", false}, // not a bool
	} {
		ce, err := ec.Compile(tc.expr)
		if err != nil {
			t.Fatalf("%q: %v", tc.expr, err)
		}
		f := New(nil, ce, nil)
		if got := accepts(f, "db.orders.7", p); got != tc.want {
			t.Errorf("%q = %v, want %v", tc.expr, got, tc.want)
		}
	}
}

func TestFilterCostIsCapped(t *testing.T) {
	ec := NewCache(100, nil)
	ce, err := ec.Compile("doc.xs.all(x, doc.xs.all(y, x + y >= 0))")
	if err != nil {
		t.Fatal(err)
	}
	var xs []string
	for i := 0; i < 200; i++ {
		xs = append(xs, "1")
	}
	p := Parse("s", []byte(`{"doc":{"xs":[`+strings.Join(xs, ",")+`]}}`), false)
	if accepts(New(nil, ce, nil), "s", p) {
		t.Fatal("an evaluation over the cost limit passed")
	}
	small := Parse("s", []byte(`{"doc":{"xs":[1,2]}}`), false)
	if !accepts(New(nil, ce, nil), "s", small) {
		t.Fatal("a cheap evaluation of the same filter failed")
	}
}

func TestFilterIndexTerms(t *testing.T) {
	ec := NewCache(10_000, nil)
	claims := map[string]any{"sub": "c-9", "cust": int64(42)}
	for _, tc := range []struct {
		grant, where string
		path, key    string // "" none
	}{
		{"", "doc.customer_id == 42", "customer_id", "i42"},
		{"", "42.0 == doc.customer_id", "customer_id", "i42"},
		{"", "doc.status == 'open' && doc.total > 100", "status", "sopen"},
		{"", "doc['a'].b == true", "a\x00b", "t"},
		{"", "doc.status == 'open' || doc.total > 100", "", ""},
		{"", "!(doc.status == 'open')", "", ""},
		{"doc.owner == claims.sub", "doc.total > 1", "owner", "sc-9"},
		{"doc.cust == claims.cust", "", "cust", "i42"},
		{"doc.cust == claims.nosuch", "", "", ""},
	} {
		var g, w *Expr
		var err error
		if tc.grant != "" {
			if g, err = ec.Compile(tc.grant); err != nil {
				t.Fatal(err)
			}
		}
		if tc.where != "" {
			if w, err = ec.Compile(tc.where); err != nil {
				t.Fatal(err)
			}
		}
		f := New(g, w, claims)
		switch {
		case tc.path == "" && f.Index != nil:
			t.Errorf("%q/%q: indexed on %q=%q, want a scan", tc.grant, tc.where, f.Index.PathKey, f.Index.Key)
		case tc.path != "" && (f.Index == nil || f.Index.PathKey != tc.path || f.Index.Key != tc.key):
			t.Errorf("%q/%q: index %+v, want %q=%q", tc.grant, tc.where, f.Index, tc.path, tc.key)
		}
	}
}

func TestFilterClaimsAreValuesNotText(t *testing.T) {
	ec := NewCache(10_000, nil)
	g, err := ec.Compile("doc.owner == claims.sub")
	if err != nil {
		t.Fatal(err)
	}
	p := Parse("s", []byte(`{"doc":{"owner":"x' || true || '"}}`), false)
	// A claim that would widen the filter if it were spliced into the text.
	if !accepts(New(g, nil, map[string]any{"sub": "x' || true || '"}), "s", p) {
		t.Fatal("the claim did not match its own value")
	}
	other := Parse("s", []byte(`{"doc":{"owner":"y"}}`), false)
	if accepts(New(g, nil, map[string]any{"sub": "x' || true || '"}), "s", other) {
		t.Fatal("a claim's text widened the filter")
	}
	if k1, k2 := GrantKey(g, map[string]any{"sub": "a", "exp": 1}), GrantKey(g, map[string]any{"sub": "a", "exp": 2}); k1 != k2 {
		t.Fatal("a claim the filter does not read changed its key")
	}
	if k1, k2 := GrantKey(g, map[string]any{"sub": "a"}), GrantKey(g, map[string]any{"sub": "b"}); k1 == k2 {
		t.Fatal("a claim the filter reads did not change its key")
	}
}

// TestParseJSONAgreesWithEncodingJSON: the filters' parser gives the
// values encoding/json gives (numbers as int64 when integral and in
// range), on the data users publish, escapes and odd values included.
func TestParseJSONAgreesWithEncodingJSON(t *testing.T) {
	for _, in := range []string{
		`{"a":1,"b":-2.5,"c":"x\"y\u00e9\ud83d\ude00","d":[true,false,null,{}],"e":{"f":[]},"g":1e3,"h":12345678901234567890,"i":-0,"j":"","k":0.1}`,
		` [ 1 , "two" , { "three" : 3 } ] `,
		`"plain"`, `42`, `-9223372036854775808`, `9223372036854775808`, `1.5e-300`, `null`, `{"dup":1,"dup":2}`,
		`{"\u0000":"nul","tab\t":"\\"}`,
	} {
		got, ok := parseJSON([]byte(in))
		if !ok {
			t.Fatalf("%s: not parsed", in)
		}
		dec := json.NewDecoder(strings.NewReader(in))
		dec.UseNumber()
		var want any
		if err := dec.Decode(&want); err != nil {
			t.Fatal(err)
		}
		want = NormalizeJSON(want)
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:\n got  %#v\n want %#v", in, got, want)
		}
	}
	for _, bad := range []string{`{`, `{"a"}`, `[1,]`, `tru`, `"x`, `{"a":1}x`, ``, `-`} {
		if _, ok := parseJSON([]byte(bad)); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

func FuzzParseJSON(f *testing.F) {
	for _, s := range []string{`{"a":[1,2.5,"x"]}`, `"\u00e9"`, `-0.0e+1`, `[]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, ok := parseJSON(b)
		if !json.Valid(b) {
			return // NewEvent never lets it through: any answer will do, without a panic
		}
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		var want any
		if err := dec.Decode(&want); err != nil {
			return
		}
		if !ok {
			t.Fatalf("%q: valid JSON not parsed", b)
		}
		if want = NormalizeJSON(want); !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\n got  %#v\n want %#v", b, got, want)
		}
	})
}

// accepts is f.Accepts's verdict alone.
func accepts(f *Filter, subject string, p *Parsed) bool {
	ok, _ := f.Accepts(subject, p)
	return ok
}
