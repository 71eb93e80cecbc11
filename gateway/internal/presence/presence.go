package presence

import (
	"bytes"
	crand "crypto/rand"
	"encoding/hex"
	"encoding/json"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/gateway/internal/fanout"
	"github.com/fanwire/fanwire/jsonstr"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Presence is a node's presence: its replica of every subject's members,
// its watches, and its side of the bus. Lock order: the hub's index lock,
// then mu (a subscription starts watching while its reply is queued under
// the index); mu is never held while taking the index.
type Presence struct {
	cfg       Config      // static
	self      string      // static: this node's id, new at each start
	bus       broker.Bus  // static: nil when the broker has none (the node is alone)
	listLimit int         // static: Config.PresenceListLimit
	m         presMetrics // static

	mu      sync.Mutex
	rooms   map[string]*room            // guarded by mu: subject → members
	local   map[*Conn]map[string]string // guarded by mu: the subjects each local connection tracks, and its member's key on each
	exact   map[string][]*presenceWatch // guarded by mu: watches of a concrete subject
	wild    []*presenceWatch            // guarded by mu: watches of patterns with wildcards
	watches map[*Conn][]*presenceWatch  // guarded by mu: each connection's watches
	dirty   map[*room]struct{}          // guarded by mu: rooms with coalesced changes to deliver
	leaving map[memberRef]time.Time     // guarded by mu: members of stopped nodes, until their grace ends (unless resumed)
	drained bool                        // guarded by mu: this node stops: its members stay elsewhere, for their clients to resume
	peers   map[string]*peer            // guarded by mu: the other nodes heard from
	gone    map[string]time.Time        // guarded by mu: nodes that said bye, ignored until then
	out     []busChange                 // guarded by mu: local changes not yet sent on the bus
	ctrl    []busMsg                    // guarded by mu: sync requests to send
	snap    bool                        // guarded by mu: a node asked for this node's members
	seq     uint64                      // guarded by mu: the last delta's number
	total   int                         // guarded by mu: members in the replica, every room\'s
	wake    chan struct{}               // static, capacity 1: the sender has work
	silent  atomic.Bool                 // tests: send nothing on the bus, as a dead node (SilencePresence)
	drop    atomic.Int32                // tests: the next messages to lose on the bus (DropPresenceSends)
	closed  bool                        // guarded by mu: Run ended: local changes are not sent
	ovf     []*Conn                     // guarded by mu: connections whose mailbox overflowed, for after unlock
	wakes   []*Conn                     // guarded by mu: connections to wake after unlock
	scratch map[*Conn][]*presenceWatch  // guarded by mu: deliver's grouping, reused
	evs     []*fanout.Event             // guarded by mu: deliver's pieces, reused
	cuts    []int                       // guarded by mu: where deliver cuts its changes, reused

	// Presence messages fit their watchers' mailboxes (watch.go).
	pieceBytes int // static: the most one presence message takes (Config.PieceBytes)
	flushBytes int // static: the most of a room's coalesced changes one tick delivers: half a mailbox
}

// Config is what a Presence is made with; the Config fields named in the
// comments are the gateway's.
type Config struct {
	Bus                          broker.Bus // nil: the broker has none (the node is alone)
	Registry                     prometheus.Registerer
	Log                          *zap.Logger
	MaxMembers                   int           // Config.MaxPresenceMembers: in the node's replica
	ListLimit                    int           // Config.PresenceListLimit
	Heartbeat, Interval, Timeout time.Duration // Config.PresenceHeartbeat, PresenceInterval, PresenceTimeout
	PieceBytes                   int           // the most one presence message takes
	MailboxBytes                 int           // Config.MailboxBytes
	// parts, if set, is what the events of a change carry for watchers
	// whose connection asks for it (Conn.Parts): a transport's
	// encoding, built once per change for all of them.
	Parts func(count int, changes []Change) any
}

// Conn is presence's view of a connection: its id (the key of the
// members it tracks first), its client (the mailbox its watches deliver
// to) and whether its watches' events carry Config.Parts. Static.
type Conn struct {
	ID     string
	Client *fanout.Client
	Parts  bool
}

// room is one subject's members.
type room struct {
	subject  string
	members  map[string]*member // by key
	byResume map[string]string  // resume secret → key
	sorted   []string           // members' keys in order, for pages: built by the first page, then kept (nil until then)
	pend     map[string]Change
	// resumeAfter is the last member a tick that hit presence.flushBytes
	// delivered: the next starts after it ("" from the first).
	resumeAfter string
}

// member is one connection's presence on a subject. Its key is the id of
// the connection that first tracked it; a client that resumes it from
// another connection (its resume secret) keeps the key, and nobody sees
// it leave and join.
type member struct {
	node   string // the node holding its connection (presence.self: this one)
	owner  *Conn  // that connection, when it is this node's
	sub    string
	resume string // the secret that resumes it, known to its client and the nodes only
	gen    uint32 // its holders so far, less one: each resume adds one
	enc    []byte // {"conn":<key>[,"sub":…],"state":…}: what pages and changes carry
	st     []byte // the state as in enc (compacted JSON; "null" when none)
}

type presMetrics struct {
	members   prometheus.Gauge
	local     prometheus.Gauge
	nodes     prometheus.Gauge
	changes   *prometheus.CounterVec
	delivered prometheus.Counter
	syncs     prometheus.Counter
	expired   prometheus.Counter
	lost      prometheus.Counter
	dropped   *prometheus.CounterVec
}

func New(cfg Config) *Presence {
	p := &Presence{
		cfg: cfg, self: newPresID(), bus: cfg.Bus, listLimit: cfg.ListLimit,
		rooms: make(map[string]*room), local: make(map[*Conn]map[string]string), leaving: make(map[memberRef]time.Time),
		exact: make(map[string][]*presenceWatch), watches: make(map[*Conn][]*presenceWatch),
		dirty: make(map[*room]struct{}), peers: make(map[string]*peer), gone: make(map[string]time.Time),
		wake: make(chan struct{}, 1), scratch: make(map[*Conn][]*presenceWatch),
		pieceBytes: cfg.PieceBytes, flushBytes: cfg.MailboxBytes / 2,
	}
	p.m = presMetrics{
		members:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "fanwire_presence_members", Help: "Presence members this node knows, on every node (its replica)."}),
		local:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "fanwire_presence_local_members", Help: "Presence members of this node's connections."}),
		nodes:     prometheus.NewGauge(prometheus.GaugeOpts{Name: "fanwire_presence_nodes", Help: "Other ws nodes this node hears on the presence bus."}),
		changes:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fanwire_presence_changes_total", Help: "Presence changes applied to this node's replica, by origin (local: its connections; remote: another node's, from the bus; expired: a node that stopped heart-beating)."}, []string{"origin"}),
		delivered: prometheus.NewCounter(prometheus.CounterOpts{Name: "fanwire_presence_messages_delivered_total", Help: "Presence messages queued to subscriptions."}),
		syncs:     prometheus.NewCounter(prometheus.CounterOpts{Name: "fanwire_presence_syncs_total", Help: "Full member lists this node took from another (a node met, or a gap in its messages)."}),
		expired:   prometheus.NewCounter(prometheus.CounterOpts{Name: "fanwire_presence_nodes_expired_total", Help: "Nodes whose members were removed after they missed heart-beats for --presence-timeout."}),
		lost:      prometheus.NewCounter(prometheus.CounterOpts{Name: "fanwire_presence_bus_errors_total", Help: "Bus messages this node failed to send or could not read."}),
		dropped:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fanwire_presence_messages_dropped_total", Help: "Presence messages not queued to a watcher, by reason (too_large: one member's change is more than the watcher's mailbox holds, --mailbox-bytes)."}, []string{"reason"}),
	}
	cfg.Registry.MustRegister(p.m.members, p.m.local, p.m.nodes, p.m.changes, p.m.delivered, p.m.syncs, p.m.expired, p.m.lost, p.m.dropped)
	p.m.dropped.WithLabelValues(presDropTooLarge) // exported at 0
	return p
}

// MemberJSON encodes a member: its key, its sub (omitted when anonymous)
// and, unless leave, its state.
func MemberJSON(conn, sub string, state []byte, leave bool) []byte {
	b := make([]byte, 0, 32+len(conn)+len(sub)+len(state))
	b = append(b, `{"conn":`...)
	b = jsonstr.Append(b, conn)
	if sub != "" {
		b = append(b, `,"sub":`...)
		b = jsonstr.Append(b, sub)
	}
	if !leave {
		b = append(b, `,"state":`...)
		b = append(b, state...)
	}
	return append(b, '}')
}

// setLocked makes key a member of subject with sub and state, held by
// node (owner: its connection when node is this one), resumed with the
// secret resume: a join, or an update when its state changed. A member
// that only moved (another node or connection holds it now: a resume)
// changes nothing its watchers see. It reports whether watchers were told
// (visible) and whether the member moved.
//
// gen orders a member's holders: each resume makes it one more. A change
// from a holder older than the member's (a node that had not yet heard
// of the resume: its delta or its list) is stale, and ignored.
func (p *Presence) setLocked(subject, node string, owner *Conn, key, sub, resume string, gen uint32, state []byte, origin string) (visible, moved bool) {
	r := p.rooms[subject]
	if r == nil {
		r = &room{subject: subject, members: make(map[string]*member), byResume: make(map[string]string)}
		p.rooms[subject] = r
	}
	if len(state) == 0 {
		state = fanout.NullJSON
	}
	ref := memberRef{subject, key}
	old := r.members[key]
	if old != nil && gen < old.gen {
		return false, false
	}
	if old != nil {
		if old.node != node || old.owner != owner {
			moved = true
			p.releaseLocked(ref, old)
		}
		if old.resume != resume {
			delete(r.byResume, old.resume)
		}
		delete(p.leaving, ref)
	}
	if node != p.self {
		if pr := p.peers[node]; pr != nil {
			pr.members[ref] = struct{}{}
		}
	}
	if resume != "" {
		r.byResume[resume] = key
	}
	if old != nil && old.sub == sub && bytes.Equal(old.st, state) {
		old.node, old.owner, old.resume, old.gen = node, owner, resume, gen
		return false, moved
	}
	enc := MemberJSON(key, sub, state, false)
	m := &member{node: node, owner: owner, sub: sub, resume: resume, gen: gen, enc: enc, st: enc[len(enc)-1-len(state) : len(enc)-1]}
	r.members[key] = m
	op := byte(OpUpdate)
	if old == nil {
		op = OpJoin
		if r.sorted != nil {
			i, _ := slices.BinarySearch(r.sorted, key)
			r.sorted = slices.Insert(r.sorted, i, key)
		}
		p.m.members.Inc()
		p.total++
	}
	p.m.changes.WithLabelValues(origin).Inc()
	p.emitLocked(r, key, op, enc)
	return true, moved
}

// releaseLocked forgets who held m (ref) before it moved: its node's list,
// or its connection's subjects on this node.
func (p *Presence) releaseLocked(ref memberRef, m *member) {
	if m.node != p.self {
		if pr := p.peers[m.node]; pr != nil {
			delete(pr.members, ref)
		}
		return
	}
	if subjects := p.local[m.owner]; subjects != nil && subjects[ref.subject] == ref.conn {
		delete(subjects, ref.subject)
		if len(subjects) == 0 {
			delete(p.local, m.owner)
		}
		p.m.local.Dec()
	}
}

// removeLocked removes key from subject's members if node (and, on this
// node, owner) holds it; it reports whether it did.
func (p *Presence) removeLocked(subject, node string, owner *Conn, key, origin string) bool {
	r := p.rooms[subject]
	if r == nil {
		return false
	}
	m := r.members[key]
	if m == nil || m.node != node || (node == p.self && m.owner != owner) {
		return false
	}
	delete(r.members, key)
	delete(r.byResume, m.resume)
	delete(p.leaving, memberRef{subject, key})
	if i, found := slices.BinarySearch(r.sorted, key); found {
		r.sorted = slices.Delete(r.sorted, i, i+1)
	}
	p.m.members.Dec()
	p.total--
	p.m.changes.WithLabelValues(origin).Inc()
	p.emitLocked(r, key, OpLeave, MemberJSON(key, m.sub, nil, true))
	if len(r.members) == 0 && len(r.pend) == 0 {
		delete(p.rooms, subject)
	}
	return true
}

// Track makes c a member of subject with state (compacted JSON) and its
// token's sub ("" anonymous), or
// updates its state. resume, when it is the secret of a member of subject
// with c's sub (on any node, its connection gone or going), makes c that
// member again: same key, no leave, no join. It returns the member's key
// and secret, or why it refused: CodeTooManyTracks when c tracks max
// subjects already, CodeTooManyMembers when the node's replica holds
// Config.MaxPresenceMembers.
func (p *Presence) Track(c *Conn, sub, subject string, state []byte, resume string, max int) (key, secret, refused string) {
	p.mu.Lock()
	defer p.unlock()
	subjects := p.local[c]
	key, ok := subjects[subject]
	var gen uint32
	if ok {
		m := p.rooms[subject].members[key]
		secret, gen = m.resume, m.gen
	} else {
		if len(subjects) >= max {
			return "", "", CodeTooManyTracks
		}
		if p.total >= p.cfg.MaxMembers {
			return "", "", CodeTooManyMembers
		}
		key = c.ID
		if r := p.rooms[subject]; r != nil && resume != "" {
			if k, found := r.byResume[resume]; found && r.members[k].sub == sub {
				key, secret, gen = k, resume, r.members[k].gen+1
			}
		}
		if secret == "" {
			secret = newResumeSecret()
		}
		if subjects == nil {
			subjects = make(map[string]string)
			p.local[c] = subjects
		}
		subjects[subject] = key
		p.m.local.Inc()
	}
	if len(state) == 0 {
		state = fanout.NullJSON
	}
	visible, moved := p.setLocked(subject, p.self, c, key, sub, secret, gen, state, "local")
	if visible || moved {
		p.sendLocked(busChange{Op: string(rune(OpJoin)), Subject: subject, Conn: key, Sub: sub, State: state, Resume: secret, Gen: gen})
	}
	return key, secret, ""
}

// newResumeSecret is a member's resume secret: 128 random bits.
func newResumeSecret() string { return newPresID() + newPresID() }

// Untrack ends c's membership of subject; it reports whether c was a
// member.
func (p *Presence) Untrack(c *Conn, subject string) bool {
	p.mu.Lock()
	defer p.unlock()
	subjects := p.local[c]
	key, ok := subjects[subject]
	if !ok {
		return false
	}
	delete(subjects, subject)
	if len(subjects) == 0 {
		delete(p.local, c)
	}
	p.m.local.Dec()
	if p.removeLocked(subject, p.self, c, key, "local") {
		p.sendLocked(busChange{Op: string(rune(OpLeave)), Subject: subject, Conn: key})
	}
	return true
}

// LeaveAll ends every membership and watch of c (its connection ended).
// On a node that stops (drain), its members are left to the other nodes,
// which keep them for their clients to resume elsewhere until the grace
// ends (bus.go).
func (p *Presence) LeaveAll(c *Conn) {
	p.mu.Lock()
	defer p.unlock()
	for _, w := range p.watches[c] {
		p.unwatchLocked(w)
	}
	delete(p.watches, c)
	subjects := p.local[c]
	delete(p.local, c)
	names := make([]string, 0, len(subjects))
	for s := range subjects {
		names = append(names, s)
	}
	slices.Sort(names)
	for _, subject := range names {
		p.m.local.Dec()
		if p.drained {
			// The node stops: its members stay for the grace on the
			// other nodes, where its watchers are about to list them
			// again. Telling those watchers a leave now would be a flap.
			continue
		}
		key := subjects[subject]
		if p.removeLocked(subject, p.self, c, key, "local") {
			p.sendLocked(busChange{Op: string(rune(OpLeave)), Subject: subject, Conn: key})
		}
	}
}

// Tracked is the subjects c tracks, in order.
func (p *Presence) Tracked(c *Conn) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.local[c]))
	for s := range p.local[c] {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// Page is one page of subject's members in key order, after the key
// after ("" from the first), at most limit of them and, past the first,
// at most maxBytes of the reply's members list and next together (each
// member and its comma, and the next field: membersMessage): the members'
// JSON, the count of all, and the key to ask after next ("" at the end).
func (p *Presence) Page(subject, after string, limit, maxBytes int) (members [][]byte, count int, next string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.rooms[subject]
	if r == nil {
		return nil, 0, ""
	}
	if r.sorted == nil {
		r.sorted = make([]string, 0, len(r.members))
		for k := range r.members {
			r.sorted = append(r.sorted, k)
		}
		sort.Strings(r.sorted)
	}
	i := 0
	if after != "" {
		i = sort.SearchStrings(r.sorted, after)
		if i < len(r.sorted) && r.sorted[i] == after {
			i++
		}
	}
	end := min(i+limit, len(r.sorted))
	members = make([][]byte, 0, end-i)
	used := 0
	for j, k := range r.sorted[i:end] {
		enc := r.members[k].enc
		n := len(enc) + 1
		tail := 0 // the next field, should the page end here
		if i+j+1 < len(r.sorted) {
			tail = len(nextField) + jsonstr.Len(k)
		}
		if j > 0 && used+n+tail > maxBytes {
			end = i + j // stop early: next is the last member listed
			break
		}
		used += n
		members = append(members, enc)
	}
	if end < len(r.sorted) {
		next = r.sorted[end-1]
	}
	return members, len(r.members), next
}

const nextField = `,"next":`

// MembersMessage is the reply to a members request.
func MembersMessage(id, subject string, members [][]byte, count int, next string) []byte {
	n := 64 + len(id) + len(subject)
	for _, m := range members {
		n += len(m) + 1
	}
	b := make([]byte, 0, n)
	b = append(b, `{"type":"members","id":`...)
	b = jsonstr.Append(b, id)
	b = append(b, `,"subject":`...)
	b = jsonstr.Append(b, subject)
	b = append(b, `,"count":`...)
	b = strconv.AppendInt(b, int64(count), 10)
	b = append(b, `,"members":[`...)
	for i, m := range members {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, m...)
	}
	b = append(b, ']')
	if next != "" {
		b = append(b, nextField...)
		b = jsonstr.Append(b, next)
	}
	return append(b, '}')
}

// CompactState checks a member's state: any JSON value, compacted, at
// most max bytes.
func CompactState(raw json.RawMessage, max int) ([]byte, error) {
	if raw == nil {
		return fanout.NullJSON, nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	if len(b) > max {
		return nil, ErrStateTooLarge
	}
	return fixUTF8IfNeeded(b), nil
}

// fixUTF8IfNeeded replaces invalid UTF-8 (which encoding/json lets through
// inside strings) as events do.
func fixUTF8IfNeeded(b []byte) []byte {
	if utf8.Valid(b) {
		return b
	}
	return fanout.FixUTF8(b)
}

// The codes Track refuses with (the gateway's public codes of the same
// names).
const (
	CodeTooManyTracks  = "too_many_tracks"
	CodeTooManyMembers = "too_many_members"
)

// presDropTooLarge is the reason fanwire_presence_messages_dropped_total
// counts a change too big for a watcher's mailbox under.
const presDropTooLarge = "too_large"

// newPresID is 64 random bits in hex: a node's id, and half a resume
// secret.
func newPresID() string {
	var b [8]byte
	_, _ = crand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}
