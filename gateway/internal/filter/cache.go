package filter

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

// Cache compiles each distinct text once and shares it while anything
// holds it. Filters hold their expressions; the cache holds them weakly, so
// an expression no subscription uses is freed by the garbage collector.
// Besides, it keeps the most recently used ones strongly, up to
// maxIdleExprBytes of their estimated size, so that a client that
// resubscribes (a reconnect, a page reload) does not compile again. Before,
// it kept up to 4,096 texts whatever their size, and nothing bounded a
// compiled pattern's program: ten hostile subscribes held 1.4 GiB.
type Cache struct {
	mu      sync.Mutex
	m       map[string]weak.Pointer[Expr] // guarded by mu
	recent  list.List                     // guarded by mu: *Expr, most recent first
	at      map[*Expr]*list.Element       // guarded by mu: place in recent
	bytes   int                           // guarded by mu: sizes in recent
	maxCost uint64                        // static

	live      atomic.Int64 // estimated bytes of every compiled expression not yet freed
	onCompile func()       // static: counts a compilation (metrics); may be nil
}

// maxIdleExprBytes bounds the recently used expressions kept for reuse
// (estimated sizes): a few hundred typical filters.
const maxIdleExprBytes = 8 << 20

// NewCache makes a cache whose expressions may cost up to maxCost per
// evaluation; onCompile, if not nil, is called at each compilation (a
// cache miss), for a metric.
func NewCache(maxCost uint64, onCompile func()) *Cache {
	return &Cache{m: make(map[string]weak.Pointer[Expr]), at: make(map[*Expr]*list.Element), maxCost: maxCost, onCompile: onCompile}
}

// Live is the estimated memory of the compiled expressions not yet freed
// (bytes): those filters hold, and the recently used ones kept for reuse.
func (ec *Cache) Live() int64 { return ec.live.Load() }

// Lookup returns text's compiled expression if one is alive.
func (ec *Cache) Lookup(text string) *Expr {
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

// Compile returns text's compiled expression, or an error wrapping
// ErrBadFilter that says what and where.
func (ec *Cache) Compile(text string) (*Expr, error) {
	if ce := ec.Lookup(text); ce != nil {
		return ce, nil
	}
	ce, err := compileExpr(text, ec.maxCost)
	if err != nil {
		return nil, err
	}
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
func (ec *Cache) freed(e exprFreed) {
	ec.live.Add(-int64(e.size))
	ec.mu.Lock()
	if wp, ok := ec.m[e.text]; ok && wp.Value() == nil {
		delete(ec.m, e.text)
	}
	ec.mu.Unlock()
}

// touchLocked puts ce first in recent, dropping the least recent past
// maxIdleExprBytes (subscriptions that hold them keep them alive).
func (ec *Cache) touchLocked(ce *Expr) {
	if el, ok := ec.at[ce]; ok {
		ec.recent.MoveToFront(el)
		return
	}
	ec.at[ce] = ec.recent.PushFront(ce)
	ec.bytes += ce.size
	for ec.bytes > maxIdleExprBytes && ec.recent.Len() > 1 {
		old := ec.recent.Remove(ec.recent.Back()).(*Expr)
		delete(ec.at, old)
		ec.bytes -= old.size
	}
}

// Set interns filters: equal filters (filterKey) are one value, so
// the dispatcher evaluates them once per event whatever the connections
// holding them. It holds them weakly: a filter no subscription holds is
// freed.
type Set struct {
	mu sync.Mutex
	m  map[string]weak.Pointer[Filter] // guarded by mu
}

func NewSet() *Set {
	return &Set{m: make(map[string]weak.Pointer[Filter])}
}

// Get returns the node's filter for grant and where under claims.
func (fs *Set) Get(grant, where *Expr, claims map[string]any) *Filter {
	key := filterKey(grant, where, claims)
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if wp, ok := fs.m[key]; ok {
		if f := wp.Value(); f != nil {
			return f
		}
	}
	f := New(grant, where, claims)
	fs.m[key] = weak.Make(f)
	runtime.AddCleanup(f, fs.freed, key)
	return f
}

func (fs *Set) freed(key string) {
	fs.mu.Lock()
	if wp, ok := fs.m[key]; ok && wp.Value() == nil {
		delete(fs.m, key)
	}
	fs.mu.Unlock()
}

// Len is the number of distinct filters alive.
func (fs *Set) Len() int {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return len(fs.m)
}

// Bucket is a token bucket of cost units (or compilations): rate a
// second, up to burst. Its owner serializes the calls.
type Bucket struct {
	tokens float64
	last   time.Time
}

// Take takes n tokens if there are; with a debt allowed (take n even
// below zero) it always takes them and reports whether it had them.
func (b *Bucket) Take(now time.Time, rate, burst, n float64, debt bool) bool {
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

// Wait is how long until the bucket is back to zero (0: it is not in
// debt).
func (b *Bucket) Wait(rate float64) time.Duration {
	if b.tokens >= 0 || rate <= 0 {
		return 0
	}
	return time.Duration(-b.tokens / rate * float64(time.Second))
}

// ErrCompileRate refuses a subscribe whose filter would be compiled past
// the connection's rate (the gateway's --filter-compile-rate).
type ErrCompileRate struct{ Rate int }

func (e ErrCompileRate) Error() string {
	return fmt.Sprintf("where: over %s new filter texts compiled per second on this connection (--filter-compile-rate): try again in a second; texts the node already holds cost nothing", strconv.Itoa(e.Rate))
}
