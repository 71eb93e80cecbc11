package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBadConfigFailsAtStart: "fanwire ingest --config" and "fanwire dev
// --pg --config" with a bad projections file exit at start-up, before
// connecting to anything (the PostgreSQL and NATS here do not exist), with
// the file, the line and each problem in the message. Also from
// FANWIRE_CONFIG.
func TestBadConfigFailsAtStart(t *testing.T) {
	dir := t.TempDir()
	unknown := filepath.Join(dir, "unknown.yaml")
	invalid := filepath.Join(dir, "invalid.yaml")
	write := func(path, s string) {
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(unknown, "projections:\n  - name: orders\n    table: orders\n    key: id\n    colums: [id]\n")
	write(invalid, "projections:\n  - name: orders\n    table: orders\n    embed:\n      - as: items\n        table: order_items\n")
	ingest := []string{"ingest", "--pg", "postgres://fanwire@127.0.0.1:1/none", "--nats-url", "nats://127.0.0.1:1",
		"--listen", "127.0.0.1:0", "--log-level", "error"}
	dev := []string{"dev", "--pg", "postgres://fanwire@127.0.0.1:1/none", "--data-dir", filepath.Join(dir, "data"),
		"--listen", "127.0.0.1:0", "--log-level", "error"}
	for _, tc := range []struct {
		name string
		args []string
		env  string
		want []string
	}{
		{"ingest unknown field", append(ingest, "--config", unknown), "",
			[]string{"fanwire ingest: --config: " + unknown + `: line 5, column 5: unknown field "colums"`}},
		{"ingest invalid", append(ingest, "--config", invalid), "",
			[]string{"fanwire ingest: --config: " + invalid + `: projection "orders": key: required`,
				`projection "orders": embed[0] ("items"): on: needs at least one child column: parent column pair`}},
		{"ingest missing file", append(ingest, "--config", filepath.Join(dir, "none.yaml")), "",
			[]string{"fanwire ingest: --config: projections: open " + filepath.Join(dir, "none.yaml")}},
		{"ingest FANWIRE_CONFIG", ingest, unknown,
			[]string{`unknown field "colums"`}},
		{"dev unknown field", append(dev, "--config", unknown), "",
			[]string{"fanwire dev: --config: " + unknown + `: line 5, column 5: unknown field "colums"`}},
		{"dev without pg", []string{"dev", "--config", unknown}, "",
			[]string{"fanwire dev: --config needs --pg"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("FANWIRE_CONFIG", tc.env)
			}
			var out, errOut bytes.Buffer
			code := run(tc.args, &out, &errOut)
			if code != 1 {
				t.Errorf("exit %d, want 1; stderr %q", code, errOut.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut.String(), w) {
					t.Errorf("stderr %q, want it to contain %q", errOut.String(), w)
				}
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Errorf("dev made its data dir before refusing the config: %v", err)
	}
}
