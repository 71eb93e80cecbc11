package gateway

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// benchGraphQL serves the POST body through s's handler b.N times.
func benchGraphQL(b *testing.B, s *Server, body string, want int) {
	h := s.Handler()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		req := httptest.NewRequest(http.MethodPost, "/graphql", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != want {
			b.Fatalf("status %d, want %d: %.200s", rec.Code, want, rec.Body.Bytes())
		}
	}
}

// BenchmarkGraphQLHostileQuery: the overlapping-fields exploit (4,000
// aliased repeats, 160 KB, 56,000 tokens) through the HTTP handler:
// refused by the tokens limit, the parser stopping at the 4,001st.
func BenchmarkGraphQLHostileQuery(b *testing.B) {
	s := newTestServer(b)
	body := `{"query":"{` + strings.Repeat(" a:health{status} a:subscribable{broker}", 4000) + ` }"}`
	benchGraphQL(b, s, body, http.StatusUnprocessableEntity)
}

// BenchmarkGraphQLSmallQuery: a small query through the HTTP handler, with
// the default limits and with every query limit lifted: what the limits
// cost a normal request.
func BenchmarkGraphQLSmallQuery(b *testing.B) {
	const body = `{"query":"{ health { status ready } subscribable { patterns broker history } }"}`
	b.Run("limits", func(b *testing.B) {
		benchGraphQL(b, newTestServer(b), body, http.StatusOK)
	})
	b.Run("no-limits", func(b *testing.B) {
		s := newTestServer(b)
		cfg := s.cfg
		cfg.Registry = nil
		cfg.GraphQLMaxQueryBytes, cfg.GraphQLMaxTokens, cfg.GraphQLMaxDepth, cfg.GraphQLMaxAliases, cfg.GraphQLMaxComplexity = -1, -1, -1, -1, -1
		unlimited, err := New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		benchGraphQL(b, unlimited, body, http.StatusOK)
	})
}
