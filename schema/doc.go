// Package schema is fanwire's GraphQL schema (fanwire.graphqls) and the code
// gqlgen generates from it. The gateway serves it at /graphql; see
// docs/graphql.md.
//
// The generated files (generated.go, models_gen.go) are committed and must
// match the schema: `go generate ./schema` rebuilds them, and `make test`
// fails when they are stale.
package schema

//go:generate sh -c "cd .. && go tool gqlgen generate --config gqlgen.yml"
