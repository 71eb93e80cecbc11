// Package pgjson turns PostgreSQL column values, in the text output format
// that pgoutput and the simple query protocol send, into JSON: the mapping
// of docs/ingest.md's table "Column values as JSON" (values.go lists it
// too; keep the two in step).
//
//   - AppendValue encodes one value of a built-in type, by its type OID,
//     and AppendArray an array whose element type the caller names (their
//     strings written by package jsonstr). They append to a
//     caller's buffer and allocate only when it must grow; malformed text
//     is an error wrapping ErrMalformedValue, never invalid JSON.
//   - The values must be written with OutputParams' session settings
//     (DateStyle ISO above all).
//   - A TypeCache resolves the types AppendValue cannot know (domains,
//     arrays of user-defined types) from the catalog, once each, to the
//     Type whose Append encodes the column's values.
//   - ParseISODate reads the date that starts a date or timestamp value,
//     for callers that order such values as PostgreSQL does.
//
// Concurrency: AppendValue, AppendArray and a Type's
// Append keep no state; any goroutine may call them. A TypeCache has no
// lock: one goroutine owns it and alone calls its Lookup and Get (the
// ingest's is the goroutine that runs its connections).
package pgjson
