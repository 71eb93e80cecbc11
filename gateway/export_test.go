package gateway

// ForceGraphQLExecutor makes s serve every GraphQL subscription through
// gqlgen's executor, as it does the selections its fast path does not
// cover. Call it before any connection.
func ForceGraphQLExecutor(s *Server) { s.gqlExecutorOnly = true }
