package gateway

import (
	"container/list"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"weak"
)

// exprCache compiles each distinct text once and shares it while anything
// holds it. Filters hold their expressions; the cache holds them weakly, so
// an expression no subscription uses is freed by the garbage collector.
// Besides, it keeps the most recently used ones strongly, up to
// maxIdleExprBytes of their estimated size, so that a client that
// resubscribes (a reconnect, a page reload) does not compile again. Before,
// it kept up to 4,096 texts whatever their size, and nothing bounded a
// compiled pattern's program: ten hostile subscribes held 1.4 GiB.
type exprCache struct {
	mu      sync.Mutex
	m       map[string]weak.Pointer[compiledExpr] // guarded by mu
	recent  list.List                             // guarded by mu: *compiledExpr, most recent first
	at      map[*compiledExpr]*list.Element       // guarded by mu: place in recent
	bytes   int                                   // guarded by mu: sizes in recent
	maxCost uint64                                // static

	live      atomic.Int64 // estimated bytes of every compiled expression not yet freed
	compiles  atomic.Int64 // compilations (cache misses)
	onCompile func()       // static: counts a compilation (metrics); may be nil
}

// maxIdleExprBytes bounds the recently used expressions kept for reuse
// (estimated sizes): a few hundred typical filters.
const maxIdleExprBytes = 8 << 20

func newExprCache(maxCost uint64) *exprCache {
	return &exprCache{m: make(map[string]weak.Pointer[compiledExpr]), at: make(map[*compiledExpr]*list.Element), maxCost: maxCost}
}

// lookup returns text's compiled expression if one is alive.
func (ec *exprCache) lookup(text string) *compiledExpr {
	ec.mu.Lock()
	defer ec.mu.Unlock()
	wp, ok := ec.m[text]
	if !ok {
		return nil
	}
	ce := wp.Value()
	if ce != nil {
		ec.touchLocked(ce)
	}
	return ce
}

// compile returns text's compiled expression, or an error wrapping
// ErrBadFilter that says what and where.
func (ec *exprCache) compile(text string) (*compiledExpr, error) {
	if ce := ec.lookup(text); ce != nil {
		return ce, nil
	}
	ce, err := compileExpr(text, ec.maxCost)
	if err != nil {
		return nil, err
	}
	ec.compiles.Add(1)
	if ec.onCompile != nil {
		ec.onCompile()
	}
	ec.mu.Lock()
	defer ec.mu.Unlock()
	if wp, ok := ec.m[text]; ok {
		if other := wp.Value(); other != nil { // compiled meanwhile by another connection
			ec.touchLocked(other)
			return other, nil
		}
	}
	ec.m[text] = weak.Make(ce)
	ec.live.Add(int64(ce.size))
	runtime.AddCleanup(ce, ec.freed, exprFreed{text: text, size: ce.size})
	ec.touchLocked(ce)
	return ce, nil
}

type exprFreed struct {
	text string
	size int
}

// freed runs (on the runtime's cleanup goroutine) once an expression is
// unreachable: its entry goes, unless the text was compiled again since.
func (ec *exprCache) freed(e exprFreed) {
	ec.live.Add(-int64(e.size))
	ec.mu.Lock()
	if wp, ok := ec.m[e.text]; ok && wp.Value() == nil {
		delete(ec.m, e.text)
	}
	ec.mu.Unlock()
}

// touchLocked puts ce first in recent, dropping the least recent past
// maxIdleExprBytes (subscriptions that hold them keep them alive).
func (ec *exprCache) touchLocked(ce *compiledExpr) {
	if el, ok := ec.at[ce]; ok {
		ec.recent.MoveToFront(el)
		return
	}
	ec.at[ce] = ec.recent.PushFront(ce)
	ec.bytes += ce.size
	for ec.bytes > maxIdleExprBytes && ec.recent.Len() > 1 {
		old := ec.recent.Remove(ec.recent.Back()).(*compiledExpr)
		delete(ec.at, old)
		ec.bytes -= old.size
	}
}

// filterSet interns filters: equal filters (filterKey) are one value, so
// the dispatcher evaluates them once per event whatever the connections
// holding them. It holds them weakly: a filter no subscription holds is
// freed.
type filterSet struct {
	mu sync.Mutex
	m  map[string]weak.Pointer[filter] // guarded by mu
}

func newFilterSet() *filterSet {
	return &filterSet{m: make(map[string]weak.Pointer[filter])}
}

// get returns the node's filter for grant and where under claims.
func (fs *filterSet) get(grant, where *compiledExpr, claims map[string]any) *filter {
	key := filterKey(grant, where, claims)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if wp, ok := fs.m[key]; ok {
		if f := wp.Value(); f != nil {
			return f
		}
	}
	f := newFilter(grant, where, claims)
	fs.m[key] = weak.Make(f)
	runtime.AddCleanup(f, fs.freed, key)
	return f
}

func (fs *filterSet) freed(key string) {
	fs.mu.Lock()
	if wp, ok := fs.m[key]; ok && wp.Value() == nil {
		delete(fs.m, key)
	}
	fs.mu.Unlock()
}

// size is the number of distinct filters alive.
func (fs *filterSet) size() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return len(fs.m)
}

// costBucket is a token bucket of cost units (or compilations): rate a
// second, up to burst. Its owner serializes the calls.
type costBucket struct {
	tokens float64
	last   time.Time
}

// take takes n tokens if there are; with a debt allowed (take n even
// below zero) it always takes them and reports whether it had them.
func (b *costBucket) take(now time.Time, rate, burst, n float64, debt bool) bool {
	if b.last.IsZero() {
		b.tokens = burst
	} else {
		b.tokens = min(burst, b.tokens+now.Sub(b.last).Seconds()*rate)
	}
	b.last = now
	if b.tokens < n && !debt {
		return false
	}
	ok := b.tokens >= n
	b.tokens -= n
	return ok
}

// wait is how long until the bucket is back to zero (0: it is not in
// debt).
func (b *costBucket) wait(rate float64) time.Duration {
	if b.tokens >= 0 || rate <= 0 {
		return 0
	}
	return time.Duration(-b.tokens / rate * float64(time.Second))
}

// errCompileRate refuses a subscribe whose filter would be compiled past
// the connection's rate (Config.FilterCompileRate).
type errCompileRate struct{ rate int }

func (e errCompileRate) Error() string {
	return fmt.Sprintf("where: over %s new filter texts compiled per second on this connection (--filter-compile-rate): try again in a second; texts the node already holds cost nothing", strconv.Itoa(e.rate))
}
