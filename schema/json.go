package schema

import (
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

// UnmarshalGQL refuses input: JSON is an output type in this schema.
func (j *JSON) UnmarshalGQL(v any) error {
	return fmt.Errorf("JSON is output only (got %T)", v)
}
