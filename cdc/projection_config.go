package cdc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/goccy/go-yaml"
)

// maxEmbedNesting is how deep embeds may nest: a projection's embed is level
// 1, an embed inside it level 2.
const maxEmbedNesting = 4

// pgNameRE is a PostgreSQL identifier that needs no quotes (apart from
// case): a letter or '_', then letters, digits, '_' or '$', at most 63
// bytes (NAMEDATALEN-1).
var pgNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_$]{0,62}$`)

// LoadProjections reads the projections of the --config file at path (see
// ParseProjections). Errors name the file.
func LoadProjections(path string) ([]ProjectionSpec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("projections: %w", err)
	}
	specs, err := ParseProjections(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return specs, nil
}

// ParseProjections decodes a YAML document of projections (a top-level
// "projections" list; docs/projections.md) strictly: an unknown field is an
// error with its line. It then checks the specs' structure, without a
// database, and reports every problem at once (errors.Join), each naming
// its projection and the field's path. An empty Mode becomes ModeSQL.
func ParseProjections(data []byte) ([]ProjectionSpec, error) {
	var doc struct {
		Projections *[]ProjectionSpec `yaml:"projections"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(data), yaml.DisallowUnknownField())
	if err := dec.Decode(&doc); err != nil {
		return nil, projectionYAMLError(err)
	}
	if doc.Projections == nil {
		return nil, errors.New(`no "projections": the file must be a mapping with a "projections" list (docs/projections.md)`)
	}
	specs := *doc.Projections
	if len(specs) == 0 {
		return nil, errors.New(`"projections" is empty: list at least one projection`)
	}
	if err := validateProjections(specs); err != nil {
		return nil, err
	}
	return specs, nil
}

// projectionYAMLError turns a decoding error into one line: "line L, column C: msg"
// (go-yaml's own text also prints the source, over several lines).
func projectionYAMLError(err error) error {
	var ye yaml.Error
	if errors.As(err, &ye) {
		if tk := ye.GetToken(); tk != nil && tk.Position != nil {
			return fmt.Errorf("line %d, column %d: %s", tk.Position.Line, tk.Position.Column, ye.GetMessage())
		}
		return errors.New(ye.GetMessage())
	}
	if errors.Is(err, io.EOF) {
		return errors.New(`empty: the file must be a mapping with a "projections" list (docs/projections.md)`)
	}
	return err
}

// validateProjections checks specs and sets each empty Mode to ModeSQL.
func validateProjections(specs []ProjectionSpec) error {
	var errs []error
	names := map[string]int{} // name → index of its first projection
	for i := range specs {
		p := &specs[i]
		label := fmt.Sprintf("projection [%d]", i)
		if p.Name != "" {
			label = fmt.Sprintf("projection %q", p.Name)
		}
		fail := func(format string, args ...any) {
			errs = append(errs, fmt.Errorf("%s: %s", label, fmt.Sprintf(format, args...)))
		}
		switch {
		case p.Name == "":
			fail("name: required")
		case !identRE.MatchString(p.Name):
			fail("name: %q: use lower-case letters, digits and '_', starting with a letter or '_', at most 63 (it is a subject token)", p.Name)
		default:
			if j, dup := names[p.Name]; dup {
				fail("name: also the name of projection [%d]; names must be unique", j)
			} else {
				names[p.Name] = i
			}
		}
		if msg := tableNameProblem(p.Table); msg != "" {
			fail("table: %s", msg)
		}
		if p.Key == "" {
			fail("key: required (the primary table's key column)")
		} else if !pgNameRE.MatchString(p.Key) {
			fail("key: %s", badColumnNameMsg(p.Key))
		}
		switch p.Mode {
		case "":
			p.Mode = ModeSQL
		case ModeSQL, ModeMemory:
		default:
			fail("mode: %q: use %q (the default) or %q", p.Mode, ModeSQL, ModeMemory)
		}
		for _, msg := range columnListProblems(p.Columns) {
			fail("columns: %s", msg)
		}
		if len(p.Columns) > 0 && p.Key != "" && !slices.Contains(p.Columns, p.Key) {
			fail("columns: must include the key %q", p.Key)
		}
		for _, e := range validateEmbedSpecs(p.Embed, p.Columns, "", 1) {
			fail("%s", e)
		}
	}
	return errors.Join(errs...)
}

// validateEmbedSpecs checks the embeds of a parent with the given columns (empty:
// all), at nesting level depth, and returns their problems, each prefixed
// with its path from the projection (path ends in ": " when not empty).
func validateEmbedSpecs(embeds []EmbedSpec, parentColumns []string, path string, depth int) []string {
	var msgs []string
	if len(embeds) > 0 && depth > maxEmbedNesting {
		return []string{fmt.Sprintf("%sembed: nested %d levels deep; at most %d", path, depth, maxEmbedNesting)}
	}
	as := map[string]int{}
	for i := range embeds {
		e := &embeds[i]
		at := fmt.Sprintf("%sembed[%d]", path, i)
		if e.As != "" {
			at += fmt.Sprintf(" (%q)", e.As)
		}
		at += ": "
		fail := func(format string, args ...any) {
			msgs = append(msgs, at+fmt.Sprintf(format, args...))
		}
		switch {
		case e.As == "":
			fail("as: required (the document field)")
		default:
			if j, dup := as[e.As]; dup {
				fail("as: also the field of embed[%d]; a parent's embeds need distinct fields", j)
			} else {
				as[e.As] = i
			}
			if slices.Contains(parentColumns, e.As) {
				fail("as: the parent's column %q has that field already", e.As)
			}
		}
		if msg := tableNameProblem(e.Table); msg != "" {
			fail("table: %s", msg)
		}
		if len(e.On) == 0 {
			fail("on: needs at least one child column: parent column pair")
		}
		child := make([]string, 0, len(e.On))
		for c := range e.On {
			child = append(child, c)
		}
		sort.Strings(child)
		for _, c := range child {
			if !pgNameRE.MatchString(c) {
				fail("on: child column %s", badColumnNameMsg(c))
			}
			if p := e.On[c]; !pgNameRE.MatchString(p) {
				fail("on: %s: parent column %s", c, badColumnNameMsg(p))
			}
		}
		if e.OrderBy != "" {
			if !e.Many {
				fail("order_by: only with many: true (one row has no order)")
			} else if !pgNameRE.MatchString(e.OrderBy) {
				fail("order_by: %s", badColumnNameMsg(e.OrderBy))
			}
		}
		for _, msg := range columnListProblems(e.Columns) {
			fail("columns: %s", msg)
		}
		msgs = append(msgs, validateEmbedSpecs(e.Embed, e.Columns, at, depth+1)...)
	}
	return msgs
}

// tableNameProblem returns what is wrong with a table name, "" if nothing.
func tableNameProblem(t string) string {
	if t == "" {
		return `required: "table" (in public) or "schema.table"`
	}
	parts := strings.Split(t, ".")
	if len(parts) > 2 {
		return fmt.Sprintf(`%q: use "table" (in public) or "schema.table"`, t)
	}
	for _, p := range parts {
		if !pgNameRE.MatchString(p) {
			return fmt.Sprintf(`%q: use "table" or "schema.table", each name letters, digits, '_' and '$', starting with a letter or '_' (no quotes)`, t)
		}
	}
	return ""
}

// columnListProblems returns what is wrong with a column list.
func columnListProblems(cols []string) []string {
	var msgs []string
	seen := map[string]bool{}
	for _, c := range cols {
		switch {
		case !pgNameRE.MatchString(c):
			msgs = append(msgs, badColumnNameMsg(c))
		case seen[c]:
			msgs = append(msgs, fmt.Sprintf("%q is listed twice", c))
		}
		seen[c] = true
	}
	return msgs
}

func badColumnNameMsg(name string) string {
	if name == "" {
		return "empty name"
	}
	return fmt.Sprintf("%q: not a column name (letters, digits, '_' and '$', starting with a letter or '_', at most 63; no quotes)", name)
}
