// Command fanwire is the fanwire gateway: one binary with a subcommand per
// role. Run "fanwire --help" for the list.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func commands() []*command {
	return []*command{devCommand(), wsCommand(), ingestCommand(), loadtestCommand(), healthCommand()}
}

func run(args []string, stdout, stderr io.Writer) int {
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		printTopUsage(stdout, cmds)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range cmds {
		if c.name != args[0] {
			continue
		}
		c.fs.SetOutput(stdout)
		if err := c.parse(args[1:]); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			fmt.Fprintf(stderr, "fanwire %s: %s\n", c.name, c.scrub.String(err.Error()))
			return 2
		}
		if err := c.run(args[1:]); err != nil {
			var ec exitCode
			if errors.As(err, &ec) {
				return int(ec)
			}
			fmt.Fprintf(stderr, "fanwire %s: %s\n", c.name, c.scrub.String(err.Error()))
			return 1
		}
		return 0
	}
	fmt.Fprintf(stderr, "fanwire: unknown command %q\n\n", args[0])
	printTopUsage(stderr, cmds)
	return 2
}

// exitCode lets a command choose its exit status without an error message.
type exitCode int

func (e exitCode) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

func printTopUsage(w io.Writer, cmds []*command) {
	fmt.Fprintf(w, `fanwire: a realtime fan-out gateway. Database changes and events, pushed live to
WebSocket clients.

Usage: fanwire <command> [flags]

Commands:
`)
	for _, c := range cmds {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, `
Every flag can also be set with an environment variable FANWIRE_<FLAG>
(upper case, '-' as '_'), e.g. --nats-url ↔ FANWIRE_NATS_URL. A flag on the
command line wins over the environment.

Run "fanwire <command> --help" for a command's flags.
`)
}
