package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/fanwire/fanwire/redact"
)

// command is one subcommand: its flags, each overridable by FANWIRE_<NAME>
// in the environment (flag name upper-cased, '-' → '_'). A flag given on the
// command line wins over the environment, which wins over the default.
type command struct {
	name    string
	summary string
	usage   string // extra text after the flag list
	fs      *flag.FlagSet
	run     func(args []string) error

	// Credentials (secrets.go): flags holding them, by kind (markSecret),
	// and what masks their values in logs and errors (set by parse).
	secretFlags map[string]secretKind
	scrub       *redact.Scrubber

	given map[string]bool // set by parse: the flags given on the command line or in the environment
}

func newCommand(name, summary string) *command {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	c := &command{name: name, summary: summary, fs: fs}
	fs.Usage = func() { c.printUsage(fs.Output()) }
	return c
}

// envName is the environment variable that overrides flag name.
func envName(name string) string {
	return "FANWIRE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// parse parses args, then applies FANWIRE_* variables to flags not given on
// the command line. A bad variable is an error naming it.
func (c *command) parse(args []string) error {
	if err := c.fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	c.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	c.given = set
	var err error
	c.fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		if v, ok := os.LookupEnv(envName(f.Name)); ok {
			set[f.Name] = true
			if e := f.Value.Set(v); e != nil && c.isSecret(f.Name) {
				err = fmt.Errorf("%s: %w", envName(f.Name), e)
			} else if e != nil {
				err = fmt.Errorf("%s=%q: %w", envName(f.Name), v, e)
			}
		}
	})
	c.scrubSecrets()
	if err != nil {
		return err
	}
	if c.fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags only; see fanwire %s --help)", c.fs.Arg(0), c.name)
	}
	return nil
}

// isGiven reports whether flag name was given, on the command line or in
// the environment, rather than left at its default.
func (c *command) isGiven(name string) bool { return c.given[name] }

func (c *command) printUsage(w io.Writer) {
	fmt.Fprintf(w, "Usage: fanwire %s [flags]\n\n%s\n\nFlags (each can also be set with the environment variable shown):\n", c.name, c.summary)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	var flags []*flag.Flag
	c.fs.VisitAll(func(f *flag.Flag) { flags = append(flags, f) })
	sort.Slice(flags, func(i, j int) bool { return flags[i].Name < flags[j].Name })
	for _, f := range flags {
		def := f.DefValue
		if def == "" {
			def = `""`
		}
		fmt.Fprintf(tw, "  --%s\t%s\t(default %s)\t%s\n", f.Name, envName(f.Name), def, f.Usage)
	}
	tw.Flush()
	if c.usage != "" {
		fmt.Fprintf(w, "\n%s\n", c.usage)
	}
}

// listFlag is a comma-separated list.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	*l = nil
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}
