package gateway

import (
	"bytes"
	"net/http"
	"time"

	"go.uber.org/zap"
)

// The inspector on a listener of its own (Config.AdminApart, fanwire's
// --admin-listen): the admin API and, at /, the console in its inspector
// mode, and nothing else, so that it can be bound to a private interface
// while the client listener faces the internet. It speaks plain HTTP: where
// the network between operators and nodes is not trusted, put TLS in front
// (a proxy, a tunnel), as for --metrics-listen and --debug-listen.

// The admin server's limits: its requests are small (a close request's body
// is at most adminMaxBody) and its answers short (a page of adminMaxLimit
// connections), so unlike the client listener it can bound whole requests.
const (
	adminReadTimeout  = 10 * time.Second // headers and body
	adminWriteTimeout = 30 * time.Second // from the end of the headers to the end of the answer
	adminIdleTimeout  = 60 * time.Second
)

// AdminHandler serves the inspector apart: /admin/ as Handler would without
// AdminApart, and the console's page at /, whose Inspector then talks to
// this origin. Without AdminApart it answers 404 to everything.
func (s *Server) AdminHandler() http.Handler {
	if s.adminMux == nil {
		return http.NotFoundHandler()
	}
	return s.adminMux
}

// AdminHTTPServer returns the http.Server to serve AdminHandler with: a
// request must arrive whole within 10 s and be answered within 30 s, and
// an idle keep-alive connection is closed after 60 s. Shut it down with
// the node.
func (s *Server) AdminHTTPServer() *http.Server {
	return &http.Server{
		Handler:           s.AdminHandler(),
		ReadHeaderTimeout: adminReadTimeout,
		ReadTimeout:       adminReadTimeout,
		WriteTimeout:      adminWriteTimeout,
		IdleTimeout:       adminIdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          zap.NewStdLog(s.log.Named("admin-http")),
	}
}

// inspectorPage serves the console marked as the inspector's page
// (data-page="inspector" on its body): it shows only its Inspector and
// opens no WebSocket, since this listener serves no /ws. The page holds no
// secret; framing is refused so that no other site can overlay the form
// the key is typed into.
func inspectorPage() http.HandlerFunc {
	page, err := consoleFS.ReadFile("console/index.html")
	if err != nil {
		panic("gateway: the embedded console has no index.html: " + err.Error())
	}
	marked := bytes.Replace(page, []byte("<body>"), []byte(`<body data-page="inspector">`), 1)
	if bytes.Equal(marked, page) {
		panic("gateway: the embedded console has no <body> to mark")
	}
	return func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Content-Security-Policy", "frame-ancestors 'none'")
		_, _ = w.Write(marked)
	}
}
