package main

import (
	"flag"
	"time"
)

// presenceFlags are the ws role's presence settings (gateway.Config's
// Presence* fields; docs/protocol.md, "Presence").
type presenceFlags struct {
	allowAnonymous bool
	maxState       int
	maxTracks      int
	maxMembers     int
	rate           int
	listLimit      int
	interval       time.Duration
	heartbeat      time.Duration
	timeout        time.Duration
}

func (p *presenceFlags) register(fs *flag.FlagSet, dev bool) {
	fs.BoolVar(&p.allowAnonymous, "allow-anonymous-presence", dev, "let connections without a token track their presence where they may subscribe (tokens track where their presence claim matches)")
	fs.IntVar(&p.maxState, "max-presence-state", 1024, "largest presence state of a member, in bytes of compacted JSON: over it, too_large")
	fs.IntVar(&p.maxTracks, "max-presence-tracks", 16, "subjects one connection may track at once: over it, too_many_tracks")
	fs.IntVar(&p.maxMembers, "max-presence-members", 1_000_000, "presence members this node holds, on every ws node together (each node holds all): over it a new member is refused with too_many_members, so that tracking cannot take a node's memory")
	fs.IntVar(&p.rate, "presence-rate", 5, "track and untrack messages per second per connection, in bursts of twice that: over it, rate_limited (negative: no limit)")
	fs.IntVar(&p.listLimit, "presence-list-limit", 100, "over this many members, a subject's joins, leaves and updates are coalesced into one message per --presence-interval for each watcher")
	fs.DurationVar(&p.interval, "presence-interval", time.Second, "how often a big subject's coalesced presence changes are delivered")
	fs.DurationVar(&p.heartbeat, "presence-heartbeat", 2*time.Second, "how often this node tells the other ws nodes on the broker that it lives")
	fs.DurationVar(&p.timeout, "presence-timeout", 10*time.Second, "a ws node not heard from for this long is dead: its members leave on every other node (at least twice --presence-heartbeat)")
}
