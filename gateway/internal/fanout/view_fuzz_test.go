package fanout

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/gateway/internal/filter"

	"github.com/fanwire/fanwire/subject"
)

// The view fuzz: random filters (a subscription's where and a grant's row
// filter reading claims), random subscriptions sharing some filters, and
// random ingest-shaped events, dispatched through the hub, against a
// reference evaluation written from CEL's semantics (three-valued && and
// || over errors) and the view rules (deliver what passes, hold it, leave
// when it stops passing or is deleted). Every subscription must get
// exactly the reference's sequence: no event a filter rejects, none
// missing, leaves exactly for what it held.

// tri is a reference value: true, false, or an error.
type tri int8

const (
	triF tri = iota
	triT
	triErr
)

// refExpr is a random expression, as text and as a reference evaluator.
type refExpr struct {
	text string
	eval func(e *refEnv) tri
}

// refEnv is what a reference evaluation sees.
type refEnv struct {
	doc     map[string]any // nil: a delete
	claims  map[string]any
	subject string
}

func randTerm(r *rand.Rand) refExpr {
	fields := []string{"a", "b", "s", "n"}
	f := fields[r.IntN(len(fields))]
	get := func(doc map[string]any) (any, bool) {
		if doc == nil {
			return nil, false
		}
		v, ok := doc[f]
		return v, ok
	}
	switch r.IntN(10) {
	case 0: // terms that need no document: deletes can pass them
		k := int64(r.IntN(4))
		return refExpr{text: "claims.k == " + strconv.FormatInt(k, 10), eval: func(e *refEnv) tri { return refEq(e.claims["k"], k) }}
	case 1:
		s := "db.t." + strconv.Itoa(r.IntN(5))
		return refExpr{text: "subject == '" + s + "'", eval: func(e *refEnv) tri { return b2t(e.subject == s) }}
	case 2:
		return refExpr{text: "op == 'delete'", eval: func(e *refEnv) tri { return b2t(e.doc == nil) }}
	}
	if r.IntN(4) == 0 { // compare to a claim
		ck := []string{"k", "sub", "missing"}[r.IntN(3)]
		return refExpr{text: "doc." + f + " == claims." + ck, eval: func(e *refEnv) tri {
			v, ok := get(e.doc)
			c, cok := e.claims[ck]
			if !ok || !cok {
				return triErr
			}
			return refEq(v, c)
		}}
	}
	if f == "s" {
		c := []string{"x", "y", "z"}[r.IntN(3)]
		op := []string{"==", "!="}[r.IntN(2)]
		return refExpr{text: "doc.s " + op + " '" + c + "'", eval: func(e *refEnv) tri {
			v, ok := get(e.doc)
			if !ok {
				return triErr
			}
			eq := refEq(v, c)
			if op == "!=" {
				return not(eq)
			}
			return eq
		}}
	}
	c := int64(r.IntN(4))
	op := []string{"==", "!=", "<", ">", ">="}[r.IntN(5)]
	lit := strconv.FormatInt(c, 10)
	if r.IntN(3) == 0 {
		lit += ".0"
	}
	return refExpr{text: "doc." + f + " " + op + " " + lit, eval: func(e *refEnv) tri {
		v, ok := get(e.doc)
		if !ok {
			return triErr
		}
		if op == "==" || op == "!=" {
			eq := refEq(v, c)
			if op == "!=" {
				return not(eq)
			}
			return eq
		}
		x, isNum := num(v)
		if !isNum {
			return triErr // no ordering of a string or null against a number
		}
		y := float64(c)
		switch op {
		case "<":
			return b2t(x < y)
		case ">":
			return b2t(x > y)
		}
		return b2t(x >= y)
	}}
}

func randExpr(r *rand.Rand, depth int) refExpr {
	if depth == 0 || r.IntN(3) == 0 {
		return randTerm(r)
	}
	a, b := randExpr(r, depth-1), randExpr(r, depth-1)
	switch r.IntN(3) {
	case 0:
		return refExpr{text: "(" + a.text + ") && (" + b.text + ")", eval: func(e *refEnv) tri {
			x, y := a.eval(e), b.eval(e)
			switch {
			case x == triF || y == triF:
				return triF
			case x == triErr || y == triErr:
				return triErr
			}
			return triT
		}}
	case 1:
		return refExpr{text: "(" + a.text + ") || (" + b.text + ")", eval: func(e *refEnv) tri {
			x, y := a.eval(e), b.eval(e)
			switch {
			case x == triT || y == triT:
				return triT
			case x == triErr || y == triErr:
				return triErr
			}
			return triF
		}}
	}
	return refExpr{text: "!(" + a.text + ")", eval: func(e *refEnv) tri { return not(a.eval(e)) }}
}

func not(t tri) tri {
	switch t {
	case triT:
		return triF
	case triF:
		return triT
	}
	return triErr
}

func b2t(b bool) tri {
	if b {
		return triT
	}
	return triF
}

func num(v any) (float64, bool) {
	switch x := v.(type) {
	case int64:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

// refEq is CEL's heterogeneous ==: numbers compare by value, other types
// are unequal (never an error).
func refEq(a, b any) tri {
	x, xn := num(a)
	y, yn := num(b)
	if xn && yn {
		return b2t(x == y)
	}
	if xn != yn {
		return triF
	}
	return b2t(a == b)
}

type refSub struct {
	vs     *View
	replay *View // the same subscription served outside the index (a resume, a snapshot, a feed: offer)
	rgot   []string
	grant  *refExpr
	where  *refExpr
	claims map[string]any
	held   map[string]bool
	want   []string // "event <subject> <n>" / "leave <subject> <n>"
	got    []string
}

func (rs *refSub) accepts(subject string, doc map[string]any) bool {
	e := &refEnv{doc: doc, claims: rs.claims, subject: subject}
	g, w := triT, triT
	if rs.grant != nil {
		g = rs.grant.eval(e)
	}
	if rs.where != nil {
		w = rs.where.eval(e)
	}
	return g == triT && w == triT
}

func TestViewDispatchAgainstReference(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	for seed := uint64(1); seed <= 60; seed++ {
		runViewFuzz(t, seed, 40, 300)
	}
}

func FuzzViewDispatch(f *testing.F) {
	f.Add(uint64(7), uint8(20), uint16(200))
	f.Fuzz(func(t *testing.T, seed uint64, nsubs uint8, nevents uint16) {
		runViewFuzz(t, seed, int(nsubs)%24+1, int(nevents)%300+1)
	})
}

func runViewFuzz(t *testing.T, seed uint64, nsubs, nevents int) {
	r := rand.New(rand.NewPCG(seed, seed*7919))
	ec := filter.NewCache(10_000, nil)
	h := NewHub(HubConfig{MaxPace: time.Millisecond})
	var subs []*refSub
	var exprs []refExpr
	for range 6 {
		exprs = append(exprs, randExpr(r, 3))
	}
	clients := []*Client{}
	for range 4 {
		clients = append(clients, NewClient(1<<20, 1<<30, func() { t.Fatal("overflow") }))
	}
	patterns := []string{"db.t.*", "db.>", "db.t.1"}
	for i := range nsubs {
		rs := &refSub{held: map[string]bool{}, claims: map[string]any{"k": int64(r.IntN(4)), "sub": []string{"x", "y"}[r.IntN(2)]}}
		pick := func() *refExpr {
			if r.IntN(3) == 0 {
				e := exprs[r.IntN(len(exprs))] // shared texts: one filter for several subscriptions
				return &e
			}
			e := randExpr(r, 3)
			return &e
		}
		if r.IntN(2) == 0 {
			rs.grant = pick()
		}
		if rs.grant == nil || r.IntN(2) == 0 {
			rs.where = pick()
		}
		var g, w *filter.Expr
		var err error
		if rs.grant != nil {
			if g, err = ec.Compile(rs.grant.text); err != nil {
				t.Fatalf("seed %d: %q: %v", seed, rs.grant.text, err)
			}
		}
		if rs.where != nil {
			if w, err = ec.Compile(rs.where.text); err != nil {
				t.Fatalf("seed %d: %q: %v", seed, rs.where.text, err)
			}
		}
		c := clients[r.IntN(len(clients))]
		id := "s" + strconv.Itoa(i)
		rs.vs = &View{Client: c, ID: id, Pattern: patterns[r.IntN(len(patterns))], Filter: filter.New(g, w, rs.claims),
			Subs: EncodeSubsList([]string{id}), Max: 1 << 20, Held: map[string]struct{}{}, OnEnd: func(code string) { t.Fatal(code) }}
		h.idx.mu.Lock()
		h.addViewLocked(rs.vs)
		h.idx.mu.Unlock()
		rs.replay = &View{Client: c, ID: id, Pattern: rs.vs.Pattern, Filter: rs.vs.Filter, Subs: rs.vs.Subs, Max: 1 << 20, Held: map[string]struct{}{}}
		subs = append(subs, rs)
	}
	var batch []*Event
	flush := func() {
		h.Dispatch(batch, "", time.Time{})
		batch = batch[:0]
	}
	for n := range nevents {
		key := r.IntN(5)
		subj := "db.t." + strconv.Itoa(key)
		var doc map[string]any
		op := "update"
		if r.IntN(8) == 0 {
			op = "delete"
		} else {
			doc = map[string]any{"a": int64(r.IntN(4)), "b": float64(r.IntN(4)) + []float64{0, 0.5}[r.IntN(2)], "s": []string{"x", "y", "z"}[r.IntN(3)]}
			if r.IntN(4) != 0 {
				doc["n"] = int64(r.IntN(4))
			} else if r.IntN(2) == 0 {
				doc["n"] = nil
			}
		}
		data, _ := json.Marshal(map[string]any{"op": op, "key": key, "doc": doc, "seq": n})
		ev, err := NewEvent(subj, "c"+strconv.Itoa(n), data)
		if err != nil {
			t.Fatal(err)
		}
		batch = append(batch, ev)
		if r.IntN(4) == 0 {
			flush()
		}
		for _, rs := range subs {
			if !subject.MatchEvent(rs.vs.Pattern, subj) {
				continue
			}
			switch deliver, leave, _, _ := rs.replay.Offer(subj, ev.Parsed()); {
			case deliver:
				rs.rgot = append(rs.rgot, fmt.Sprintf("event %s %d", subj, n))
			case leave:
				rs.rgot = append(rs.rgot, fmt.Sprintf("leave %s %d", subj, n))
			}
			if rs.accepts(subj, doc) {
				rs.want = append(rs.want, fmt.Sprintf("event %s %d", subj, n))
				if op == "delete" {
					delete(rs.held, subj)
				} else {
					rs.held[subj] = true
				}
			} else if rs.held[subj] {
				delete(rs.held, subj)
				rs.want = append(rs.want, fmt.Sprintf("leave %s %d", subj, n))
			}
		}
	}
	flush()
	byID := map[string]*refSub{}
	for _, rs := range subs {
		byID[rs.vs.ID] = rs
	}
	for _, c := range clients {
		bt := c.Mailbox.Take()
		for s := bt.First(); s != nil; s = bt.Next(s) {
			for _, it := range bt.Used(s) {
				var ids []string
				if err := json.Unmarshal(it.Subs.B, &ids); err != nil || len(ids) != 1 {
					t.Fatalf("subs %s", it.Subs.B)
				}
				kind := "event"
				if it.Ev.Kind() == KindLeave {
					kind = "leave"
				}
				n, _ := strconv.Atoi(strings.TrimPrefix(it.Ev.Cursor, "c"))
				byID[ids[0]].got = append(byID[ids[0]].got, fmt.Sprintf("%s %s %d", kind, it.Ev.Subject, n))
			}
		}
		bt.Release()
	}
	for _, rs := range subs {
		if !slices.Equal(rs.got, rs.want) {
			g, w := "", ""
			if rs.grant != nil {
				g = rs.grant.text
			}
			if rs.where != nil {
				w = rs.where.text
			}
			t.Fatalf("seed %d, %s on %s, grant %q, where %q, claims %v:\n got  %v\n want %v", seed, rs.vs.ID, rs.vs.Pattern, g, w, rs.claims, rs.got, rs.want)
		}
		if !slices.Equal(rs.rgot, rs.want) {
			t.Fatalf("seed %d, %s served outside the index:\n got  %v\n want %v", seed, rs.vs.ID, rs.rgot, rs.want)
		}
		held := make([]string, 0, len(rs.held))
		for s := range rs.held {
			held = append(held, s)
		}
		slices.Sort(held)
		if got := rs.vs.Keys(); !slices.Equal(got, held) {
			t.Fatalf("seed %d, %s holds %v, want %v", seed, rs.vs.ID, got, held)
		}
	}
}
