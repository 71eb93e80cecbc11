package cdc

// ProjectionSpec is one projection of the --config file (YAML): documents
// made of a primary row with embedded child rows, published as
// <prefix>.<name>.<key> whenever any of their rows changes. See
// docs/projections.md.
type ProjectionSpec struct {
	Name    string      `yaml:"name"`    // subject token and event name; [a-z_][a-z0-9_]*
	Table   string      `yaml:"table"`   // the primary table: "table" (public) or "schema.table"
	Key     string      `yaml:"key"`     // the primary table's key column (its primary key)
	Columns []string    `yaml:"columns"` // the primary row's columns in the document; empty: all
	Mode    string      `yaml:"mode"`    // ModeSQL (default) or ModeMemory
	Embed   []EmbedSpec `yaml:"embed"`   // child relations
}

// EmbedSpec is one relation embedded in a document: the rows of Table whose
// columns equal the parent row's (On: child column → parent column), as a
// list (Many) ordered by OrderBy, or as one object (or null).
type EmbedSpec struct {
	As      string            `yaml:"as"`       // the document field
	Table   string            `yaml:"table"`    // "table" (public) or "schema.table"
	On      map[string]string `yaml:"on"`       // child column → parent column; at least one
	Many    bool              `yaml:"many"`     // a list of rows (else one row or null)
	OrderBy string            `yaml:"order_by"` // many: the column the list is ordered by (default: the child's primary key)
	Columns []string          `yaml:"columns"`  // the child rows' columns in the document; empty: all
	Embed   []EmbedSpec       `yaml:"embed"`    // nested relations, the same way
}

// Recompose modes.
const (
	ModeSQL    = "sql"    // re-read affected documents with batched queries
	ModeMemory = "memory" // compose from an in-memory copy of the projected rows, as of each commit
)
