package browsertest

import "time"

// PageConfig describes a Page.
type PageConfig struct {
	// Timeout bounds every step in the page together, from the first to the
	// last, so a page that never reaches a state fails instead of hanging
	// CI. Required.
	Timeout time.Duration
	// State is a script whose string result describes the page, shown with
	// every failure of a step.
	State string
	// Name, if set, starts every failure message ("the second tab: ..."),
	// for tests with several pages. The page's console is logged as Name's,
	// or "page"'s.
	Name string
}

// label names the page in the lines that relay its console.
func (c PageConfig) label() string {
	if c.Name == "" {
		return "page"
	}
	return c.Name
}

// prefix starts a failure message.
func (c PageConfig) prefix() string {
	if c.Name == "" {
		return ""
	}
	return c.Name + ": "
}
