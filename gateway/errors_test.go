package gateway_test

import (
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestClientErrorCodesExportedAtZero: a fresh node exports
// fanwire_client_errors_total at 0 for every code docs/protocol.md's
// Errors table lists (and GraphQL's query_limit), so the dashboard's
// "Client errors" panel and an alert's increase read a series, at zero,
// on a healthy node; and the table and the codes the node counts are one
// set.
func TestClientErrorCodesExportedAtZero(t *testing.T) {
	doc, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "\n## Errors\n")
	if !ok {
		t.Fatal("docs/protocol.md has no Errors section")
	}
	table, _, _ = strings.Cut(table, "\n## ")
	var documented []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|").FindAllStringSubmatch(table, -1) {
		documented = append(documented, m[1])
	}
	if len(documented) < 20 {
		t.Fatalf("read %d codes from docs/protocol.md's Errors table: %v", len(documented), documented)
	}
	e := newEnv(t, nil)
	resp, err := http.Get(e.http.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var exported []string
	for _, m := range regexp.MustCompile(`(?m)^fanwire_client_errors_total\{code="([a-z_]+)"\} (\S+)$`).FindAllStringSubmatch(string(body), -1) {
		if m[2] != "0" {
			t.Errorf("a fresh node counts %s client errors of %s", m[2], m[1])
		}
		exported = append(exported, m[1])
	}
	for _, code := range documented {
		if !slices.Contains(exported, code) {
			t.Errorf("docs/protocol.md lists %s, which a fresh node does not export at 0", code)
		}
	}
	for _, code := range exported {
		if !slices.Contains(documented, code) && code != "query_limit" {
			t.Errorf("the node counts %s, which docs/protocol.md's Errors table does not list", code)
		}
	}
}
