package gateway

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"net/http"
	"time"
)

// The JavaScript client, served by every node (console or not) at
// GET /fanwire.js and its TypeScript declarations at GET /fanwire.d.ts, so
// a page anywhere can `import {connect} from "https://gateway/fanwire.js"`.
// Module scripts are fetched in CORS mode: the files allow any origin (they
// are public code, and carry no credentials). Each has a strong ETag
// computed once from its bytes; Cache-Control: no-cache makes browsers
// revalidate it, so a node running a new release serves its own client at
// once and an unchanged one costs a 304.
var (
	//go:embed client/fanwire.js
	clientJS []byte
	//go:embed client/fanwire.d.ts
	clientDTS []byte
)

// clientFileHandler serves one embedded client file with content type ct.
func clientFileHandler(content []byte, ct string) http.HandlerFunc {
	sum := sha256.Sum256(content)
	etag := `"` + hex.EncodeToString(sum[:12]) + `"`
	return func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", ct)
		h.Set("ETag", etag)
		h.Set("Cache-Control", "no-cache")
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("X-Content-Type-Options", "nosniff")
		// ServeContent answers HEAD, If-None-Match (304, no body) and ranges.
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(content))
	}
}
