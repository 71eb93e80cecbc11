// Package gatewaytest runs a real gateway in the test's process, the way
// net/http/httptest runs a real HTTP server: on a free loopback port, ready
// (consuming its broker) when Start returns, shut down gracefully by Close
// or t.Cleanup. It serves through the gateway's HTTPServer, with the
// timeouts and limits fanwire ws runs with.
package gatewaytest
