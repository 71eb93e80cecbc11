package gateway

import (
	"cmp"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/fanwire/fanwire/subject"
)

// The inspector: an HTTP API under /admin/ that lists this node's
// connections and closes them (docs/operations.md, "Inspector"). It is
// served only when Config.AdminKey is set, and every request needs
// "Authorization: Bearer <AdminKey>". It is per node: it sees and closes
// the connections of the node that answers.
//
// It reads connections from the HTTP handler's goroutine: the registry
// under Server.mu, each connection's subscriptions under subsMu, its
// mailbox under the mailbox's lock, its tracked subjects under presence's,
// and counters the writer already keeps. It adds nothing to the dispatch
// path.

// MinAdminKeyLen is the shortest Config.AdminKey, in characters: the key
// closes anyone's connection, so it must not be guessable (32 random
// hexadecimal digits are 128 bits).
const MinAdminKeyLen = 32

// Inspector limits.
const (
	adminDefaultLimit = 100  // connections per page without ?limit
	adminMaxLimit     = 1000 // most connections per page
	adminMaxBody      = 4 << 10
)

// adminAuth checks the admin key and the request's credential.
type adminAuth struct {
	sum  [sha256.Size]byte // static: sha256 of Config.AdminKey
	logs rateLimiter       // guarded by mu
	mu   sync.Mutex
}

// check reports whether r carries the key. Both sides are hashed first so
// the comparison takes the same time whatever the lengths.
func (a *adminAuth) check(r *http.Request) bool {
	h := r.Header.Get("Authorization")
	if len(h) < 7 || !strings.EqualFold(h[:7], "bearer ") {
		return false
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(h[7:])))
	return subtle.ConstantTimeCompare(got[:], a.sum[:]) == 1
}

// routeAdmin adds the inspector's endpoints to mux, or, without a key or
// with the inspector apart (Config.AdminApart: on adminMux, see
// admin_listener.go), a 404 for GET and POST under /admin/ (the console's
// file server would answer those paths otherwise), the same in both cases:
// the client listener does not tell whether an inspector runs elsewhere.
// Patterns name their methods: a pattern for every method would conflict
// with the console's "GET /".
func (s *Server) routeAdmin(mux *http.ServeMux) {
	if s.cfg.AdminKey == "" || s.cfg.AdminApart {
		notServed := func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusNotFound, apiError{Error: "the admin API is not served here: it needs --admin-key, and with --admin-listen it is served on that address only", Code: CodeNotFound})
		}
		mux.HandleFunc("GET /admin/", notServed)
		mux.HandleFunc("POST /admin/", notServed)
		if s.cfg.AdminKey == "" {
			return
		}
		mux = http.NewServeMux()
		mux.HandleFunc("GET /{$}", inspectorPage())
		s.adminMux = mux
	}
	s.admin = &adminAuth{sum: sha256.Sum256([]byte(s.cfg.AdminKey)), logs: rateLimiter{every: 10 * time.Second}}
	mux.HandleFunc("GET /admin/connections", s.adminOnly(s.serveAdminList))
	mux.HandleFunc("POST /admin/connections/close", s.adminOnly(s.serveAdminClose))
	other := s.adminOnly(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, apiError{Error: "no such admin endpoint: GET /admin/connections, POST /admin/connections/close", Code: CodeNotFound})
	})
	mux.HandleFunc("GET /admin/", other)
	mux.HandleFunc("POST /admin/", other)
}

// adminOnly serves h to requests with the admin key; others get 401,
// counted and logged (at most every 10 s).
func (s *Server) adminOnly(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.admin.check(r) {
			h(w, r)
			return
		}
		s.metrics.AdminRefused.Inc()
		a := s.admin
		a.mu.Lock()
		if a.logs.allow() {
			s.log.Warn("admin request refused: missing or wrong admin key (logged at most every 10s)",
				zap.String("remote", s.proxies.ClientAddr(r)), zap.String("method", r.Method), zap.String("path", r.URL.Path),
				zap.Int64("refused_since_last_log", a.logs.suppressed()))
		}
		a.mu.Unlock()
		w.Header().Set("WWW-Authenticate", `Bearer realm="fanwire admin"`)
		writeJSON(w, http.StatusUnauthorized, apiError{Error: "the admin API needs Authorization: Bearer <admin key>", Code: CodeUnauthorized})
	}
}

// adminConn is one connection as the inspector lists it.
type adminConn struct {
	ID              string     `json:"id"`
	Remote          string     `json:"remote"`
	Protocol        string     `json:"protocol"` // native or graphql
	Sub             string     `json:"sub"`      // the token's sub; "" without a token
	ConnectedAt     time.Time  `json:"connected_at"`
	AgeSeconds      float64    `json:"age_seconds"`
	MailboxItems    int        `json:"mailbox_items"`
	MailboxBytes    int        `json:"mailbox_bytes"`
	MessagesWritten uint64     `json:"messages_written"` // events and replies written to the socket
	BytesSent       uint64     `json:"bytes_sent"`       // payload bytes written in frames
	Subscriptions   []adminSub `json:"subscriptions"`
	Tracking        []string   `json:"tracking"` // presence subjects it is a member of
	Closing         bool       `json:"closing,omitempty"`
}

// adminSub is one subscription of a listed connection.
type adminSub struct {
	ID       string `json:"id"`
	Pattern  string `json:"pattern"`
	Kind     string `json:"kind"`              // live, view (a where, or from "latest" while it holds a snapshot), resume (from a cursor), feed, durable, presence
	Live     bool   `json:"live"`              // receiving live events (false while a resume replays)
	Waiting  bool   `json:"waiting,omitempty"` // its replay or hand-over waits for the client to read
	Presence bool   `json:"presence"`
	Filtered bool   `json:"filtered"`
}

// kind names how the subscription is served.
func (st *subState) kind() string {
	switch {
	case st.watchOnly:
		return "presence"
	case st.feed != nil && st.feed.durable != "":
		return "durable"
	case st.feed != nil:
		return "feed"
	case st.view != nil:
		return "view"
	case st.task != nil:
		return "resume"
	}
	return "live"
}

// snapshotConns returns the node's connections, sorted by id.
func (s *Server) snapshotConns() []*conn {
	s.mu.Lock()
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	slices.SortFunc(conns, func(a, b *conn) int { return cmp.Compare(a.id, b.id) })
	return conns
}

// subOf is c's token sub.
func (c *conn) subOf() string {
	if p := c.sub.Load(); p != nil {
		return *p
	}
	return ""
}

// inspect describes c.
func (c *conn) inspect(now time.Time) adminConn {
	a := adminConn{
		ID: c.id, Remote: c.remote, Protocol: "native", Sub: c.subOf(),
		ConnectedAt: c.since.UTC(), AgeSeconds: now.Sub(c.since).Seconds(),
		MessagesWritten: c.written.Load(), BytesSent: c.sent.Load(),
		Subscriptions: []adminSub{}, Closing: c.closeCode.Load() != 0,
	}
	if c.gql != nil {
		a.Protocol = "graphql"
	}
	a.MailboxItems, a.MailboxBytes = c.cl.Mailbox.Depth()
	c.subsMu.Lock()
	for id, st := range c.subs {
		a.Subscriptions = append(a.Subscriptions, adminSub{ID: id, Pattern: st.pattern, Kind: st.kind(), Live: st.live, Waiting: st.waiting, Presence: st.presence, Filtered: st.filter() != nil})
	}
	c.subsMu.Unlock()
	slices.SortFunc(a.Subscriptions, func(x, y adminSub) int { return cmp.Compare(x.ID, y.ID) })
	a.Tracking = c.s.pres.Tracked(&c.pc)
	return a
}

// matchesSubject reports whether c has a subscription whose pattern is
// subject or matches it, or tracks subject.
func (c *conn) matchesSubject(subj string) bool {
	c.subsMu.Lock()
	for _, st := range c.subs {
		if st.pattern == subj || subject.Match(st.pattern, subj) {
			c.subsMu.Unlock()
			return true
		}
	}
	c.subsMu.Unlock()
	return slices.Contains(c.s.pres.Tracked(&c.pc), subj)
}

// adminList is GET /admin/connections's answer.
type adminList struct {
	Node        int         `json:"node_connections"` // every connection on this node, before filters
	Connections []adminConn `json:"connections"`
	Next        string      `json:"next,omitempty"` // the after of the next page; absent on the last
}

// serveAdminList lists connections: ?sub= (exact), ?subject= (a subject
// or pattern: connections with a subscription of that pattern or one that
// matches it), one page of ?limit= after the id ?after=, in id order.
func (s *Server) serveAdminList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := adminDefaultLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > adminMaxLimit {
			writeJSON(w, http.StatusBadRequest, apiError{Error: "limit must be 1 to " + strconv.Itoa(adminMaxLimit), Code: CodeBadRequest, Field: "limit"})
			return
		}
		limit = n
	}
	sub, subj, after := q.Get("sub"), q.Get("subject"), q.Get("after")
	if subj != "" {
		if err := subject.ValidatePattern(subj); err != nil {
			writeJSON(w, http.StatusBadRequest, apiError{Error: err.Error(), Code: CodeBadRequest, Field: "subject"})
			return
		}
	}
	conns := s.snapshotConns()
	out := adminList{Node: len(conns), Connections: []adminConn{}}
	now := time.Now()
	for _, c := range conns {
		if after != "" && c.id <= after {
			continue
		}
		if _, isSub := q["sub"]; isSub && c.subOf() != sub {
			continue
		}
		if subj != "" && !c.matchesSubject(subj) {
			continue
		}
		if len(out.Connections) == limit {
			out.Next = out.Connections[limit-1].ID
			break
		}
		out.Connections = append(out.Connections, c.inspect(now))
	}
	s.log.Info("admin: connections listed", zap.String("by", "admin"), zap.String("remote", s.proxies.ClientAddr(r)),
		zap.String("sub", sub), zap.String("subject", subj), zap.String("after", after), zap.Int("listed", len(out.Connections)))
	writeJSON(w, http.StatusOK, out)
}

// adminCloseRequest is POST /admin/connections/close's body.
type adminCloseRequest struct {
	ID     string  `json:"id"`
	Sub    *string `json:"sub"`
	Code   int     `json:"code"`
	Reason string  `json:"reason"`
}

// validAdminCode reports whether an operator may close with code: 1000,
// 1001, 1008, or an application code (4000-4999).
func validAdminCode(code int) bool {
	return code == 1000 || code == 1001 || code == 1008 || code >= 4000 && code <= 4999
}

// serveAdminClose closes one connection (id) or all of a sub's on this
// node with the code and reason given, and answers how many it closed.
func (s *Server) serveAdminClose(w http.ResponseWriter, r *http.Request) {
	var req adminCloseRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, adminMaxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, apiError{Error: "body: want {\"id\" or \"sub\", \"code\", \"reason\"}: " + err.Error(), Code: CodeBadRequest})
		return
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		writeJSON(w, http.StatusBadRequest, apiError{Error: "body: one JSON object only", Code: CodeBadRequest})
		return
	}
	switch {
	case (req.ID == "") == (req.Sub == nil):
		writeJSON(w, http.StatusBadRequest, apiError{Error: "give exactly one of \"id\" (one connection) and \"sub\" (all of that token sub's connections on this node)", Code: CodeBadRequest, Field: "id"})
		return
	case !validAdminCode(req.Code):
		writeJSON(w, http.StatusBadRequest, apiError{Error: "code must be 1000, 1001, 1008 or 4000-4999", Code: CodeBadRequest, Field: "code"})
		return
	case len(req.Reason) > maxCloseReason || !utf8.ValidString(req.Reason):
		writeJSON(w, http.StatusBadRequest, apiError{Error: "reason must be UTF-8 of at most " + strconv.Itoa(maxCloseReason) + " bytes", Code: CodeBadRequest, Field: "reason"})
		return
	}
	reason := req.Reason
	if reason == "" {
		reason = "closed by an operator"
	}
	var closed []string
	found := 0
	for _, c := range s.snapshotConns() {
		if req.ID != "" && c.id != req.ID || req.Sub != nil && c.subOf() != *req.Sub {
			continue
		}
		found++
		if c.adminClose(req.Code, reason) {
			closed = append(closed, c.id)
		}
	}
	remote := s.proxies.ClientAddr(r)
	fields := []zap.Field{zap.String("by", "admin"), zap.String("remote", remote), zap.Int("code", req.Code), zap.String("reason", reason), zap.Strings("closed", closed)}
	if req.ID != "" {
		fields = append(fields, zap.String("conn", req.ID))
	} else {
		fields = append(fields, zap.String("sub", *req.Sub))
	}
	s.log.Info("admin: close connections", fields...)
	if req.ID != "" && found == 0 {
		writeJSON(w, http.StatusNotFound, apiError{Error: "no connection with that id on this node", Code: CodeNotFound, Field: "id"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"closed": len(closed)})
}

// adminClose asks the writer to close c with code and reason, after what
// is queued; false if a close was under way already.
func (c *conn) adminClose(code int, reason string) bool {
	c.adminCode.Store(int32(code)) // before the request: the reader's end may follow at once
	return c.requestCloseReason(code, &reason)
}
