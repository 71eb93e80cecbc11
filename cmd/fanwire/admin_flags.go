package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"unicode/utf8"

	"github.com/fanwire/fanwire/gateway"
)

// adminFlags are the ws role's inspector key and listener
// (gateway.Config.AdminKey, AdminApart; docs/operations.md, "Inspector").
type adminFlags struct {
	key     string
	keyFile string
	listen  string // its own listener (adminlisten.go); "": on --listen
}

func (a *adminFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.key, "admin-key", "", "serve the inspector (GET /admin/connections, POST /admin/connections/close: this node's connections) to requests with Authorization: Bearer <key>, a key of at least 32 characters; without it or --admin-key-file /admin/ is not served")
	fs.StringVar(&a.keyFile, "admin-key-file", "", "file holding the --admin-key (its first line, spaces trimmed)")
	fs.StringVar(&a.listen, "admin-listen", "", "when set, serve the inspector (/admin/, and its console page at /) on this address only, and answer /admin/ 404 on --listen: plain HTTP, even with --tls-cert, so give a private or loopback address; needs --admin-key or --admin-key-file")
}

// load is --admin-key, or the first line of --admin-key-file (not both);
// "" when neither is given. A key under gateway.MinAdminKeyLen characters
// is an error naming where it came from and its length, never the key.
func (a *adminFlags) load() (string, error) {
	if a.listen != "" && a.key == "" && a.keyFile == "" {
		return "", errors.New("--admin-listen needs --admin-key or --admin-key-file (FANWIRE_ADMIN_KEY): there is no inspector to serve")
	}
	if a.keyFile == "" {
		if n := utf8.RuneCountInString(a.key); a.key != "" && n < gateway.MinAdminKeyLen {
			return "", fmt.Errorf("--admin-key (FANWIRE_ADMIN_KEY): %s", shortKey(n))
		}
		return a.key, nil
	}
	if a.key != "" {
		return "", errors.New("--admin-key and --admin-key-file: give one")
	}
	b, err := os.ReadFile(a.keyFile)
	if err != nil {
		return "", fmt.Errorf("--admin-key-file: %w", err)
	}
	key, _, _ := strings.Cut(string(b), "\n")
	key = strings.TrimSpace(key)
	if key == "" {
		return "", fmt.Errorf("--admin-key-file %s: the first line is empty", a.keyFile)
	}
	if n := utf8.RuneCountInString(key); n < gateway.MinAdminKeyLen {
		return "", fmt.Errorf("--admin-key-file %s: its first line, %s", a.keyFile, shortKey(n))
	}
	return key, nil
}

func shortKey(n int) string {
	return fmt.Sprintf("the key has %d characters, the inspector needs at least %d (e.g. openssl rand -hex 32 prints 64)", n, gateway.MinAdminKeyLen)
}
