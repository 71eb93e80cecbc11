package schema

import (
	"encoding/json"
	"fmt"
	"io"
)

// JSON is a JSON value kept as its encoded bytes: it is written to responses
// exactly as it was published, never decoded and re-encoded.
type JSON []byte

// MarshalGQL writes the value as is. An empty value is null.
func (j JSON) MarshalGQL(w io.Writer) {
	if len(j) == 0 {
		_, _ = io.WriteString(w, "null")
		return
	}
	_, _ = w.Write(j)
}

// UnmarshalGQL takes an input value (a literal or a variable, as gqlgen
// decoded it) and keeps it encoded.
func (j *JSON) UnmarshalGQL(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("JSON: %w", err)
	}
	*j = b
	return nil
}
