package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
)

// adminFlags are the ws role's inspector key (gateway.Config.AdminKey;
// docs/operations.md, "Inspector").
type adminFlags struct {
	key     string
	keyFile string
}

func (a *adminFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.key, "admin-key", "", "serve the inspector (GET /admin/connections, POST /admin/connections/close: this node's connections) to requests with Authorization: Bearer <key>; without it or --admin-key-file /admin/ is not served")
	fs.StringVar(&a.keyFile, "admin-key-file", "", "file holding the --admin-key (its first line, spaces trimmed)")
}

// load is --admin-key, or the first line of --admin-key-file (not both);
// "" when neither is given.
func (a *adminFlags) load() (string, error) {
	if a.keyFile == "" {
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
	return key, nil
}
