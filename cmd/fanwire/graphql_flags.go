package main

import "flag"

// graphqlLimitFlags are the bounds on GraphQL requests (gateway.Config's
// GraphQLMax* fields).
type graphqlLimitFlags struct {
	maxBodyBytes  int64
	maxQueryBytes int
	maxTokens     int
	maxDepth      int
	maxAliases    int
	maxComplexity int
}

func (f *graphqlLimitFlags) register(fs *flag.FlagSet) {
	fs.Int64Var(&f.maxBodyBytes, "graphql-max-body-bytes", 1<<20, "largest POST /graphql body; over it: 413, too_large")
	const over = "; over it the operation (HTTP or WebSocket) is refused before validation with query_limit; negative: no limit"
	fs.IntVar(&f.maxQueryBytes, "graphql-max-query-bytes", 32<<10, "largest GraphQL query text in bytes"+over)
	fs.IntVar(&f.maxTokens, "graphql-max-tokens", 4000, "most lexical tokens (names, punctuation, values) in a GraphQL query"+over)
	fs.IntVar(&f.maxDepth, "graphql-max-depth", 24, "deepest nesting of fields in a GraphQL query, fragments expanded"+over)
	fs.IntVar(&f.maxAliases, "graphql-max-aliases", 100, "most aliased fields in a GraphQL query"+over)
	fs.IntVar(&f.maxComplexity, "graphql-max-complexity", 2000, "most fields a GraphQL query selects, fragments expanded, plus one per pair of fields with the same response name in one selection set (validation compares each such pair)"+over)
}
