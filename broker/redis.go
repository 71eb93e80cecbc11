package broker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// Redis is the Redis Streams broker: every event is an entry of one stream
// (fields "s": subject, "d": data) and carries the cursor "rs:<entry id>".
type Redis struct {
	cfg RedisConfig           // static
	rdb redis.UniversalClient // static: a *redis.Client, or a *redis.ClusterClient with Cluster
	log *zap.Logger           // static
	up  atomic.Bool
	// closed is closed by Close: Consume returns ErrClosed.
	closed    chan struct{}
	closeOnce sync.Once
	latest    latestHooks // static: tests' hooks into Latest
}

// CursorPrefixRedis starts every Redis Streams cursor.
const CursorPrefixRedis = "rs:"

// DialRedis connects and checks the server answers: on Redis Cluster, the
// primary that owns the stream's slot.
func DialRedis(ctx context.Context, cfg RedisConfig) (*Redis, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = zap.NewNop()
	}
	rdb, err := cfg.dial(ctx)
	if err != nil {
		return nil, err
	}
	b := &Redis{cfg: cfg, rdb: rdb, log: log, closed: make(chan struct{})}
	b.up.Store(true)
	return b, nil
}

type streamID struct{ ms, seq uint64 }

func parseStreamID(s string) (streamID, error) {
	a, b, ok := strings.Cut(s, "-")
	if !ok {
		return streamID{}, fmt.Errorf("%w: %q is not a stream entry id (<ms>-<seq>)", ErrBadCursor, s)
	}
	ms, err1 := strconv.ParseUint(a, 10, 64)
	seq, err2 := strconv.ParseUint(b, 10, 64)
	if err1 != nil || err2 != nil {
		return streamID{}, fmt.Errorf("%w: %q is not a stream entry id (<ms>-<seq>)", ErrBadCursor, s)
	}
	return streamID{ms, seq}, nil
}

func (x streamID) cmp(y streamID) int {
	switch {
	case x.ms != y.ms:
		if x.ms < y.ms {
			return -1
		}
		return 1
	case x.seq < y.seq:
		return -1
	case x.seq > y.seq:
		return 1
	}
	return 0
}

// ParseRedisCursor returns the stream entry id of a Redis cursor.
func ParseRedisCursor(c string) (string, error) {
	id, ok := strings.CutPrefix(c, CursorPrefixRedis)
	if !ok {
		return "", fmt.Errorf("%w: %q is not a Redis Streams cursor (rs:<ms>-<seq>)", ErrBadCursor, c)
	}
	if _, err := parseStreamID(id); err != nil {
		return "", err
	}
	return id, nil
}

// CompareCursors orders two Redis cursors.
func (b *Redis) CompareCursors(x, y string) (int, error) {
	a, err := ParseRedisCursor(x)
	if err != nil {
		return 0, err
	}
	c, err := ParseRedisCursor(y)
	if err != nil {
		return 0, err
	}
	ia, _ := parseStreamID(a)
	ic, _ := parseStreamID(c)
	return ia.cmp(ic), nil
}

// Publish appends msgs in order, trimmed approximately to MaxLen, and
// returns their cursors. The stream holds a prefix of msgs: a part that
// fails leaves the later ones unsent. A message whose ID repeats within
// DedupWindow is not appended again; its cursor is the original's. A part
// holding a message without an id is never sent again after a lost
// connection (it may be stored): Publish returns the error. How:
// docs/architecture.md, "Redis Streams: Publish and Append".
func (b *Redis) Publish(ctx context.Context, msgs []Outgoing) ([]string, error) {
	cursors := make([]string, 0, len(msgs))
	for start := 0; start < len(msgs); start += publishPart {
		part := msgs[start:min(start+publishPart, len(msgs))]
		keys := make([]string, 3, 3+len(part))
		keys[0], keys[1], keys[2] = b.cfg.Stream, b.latestKey(), b.pruneKey()
		args := make([]any, 2, 2+3*len(part))
		args[0], args[1] = b.cfg.MaxLen, b.cfg.DedupWindow.Milliseconds()
		retry := true
		for _, m := range part {
			if m.ID == "" {
				retry = false
				keys = append(keys, b.cfg.Stream) // never read
			} else {
				keys = append(keys, b.dedupKey(m.ID))
			}
			args = append(args, m.Subject, m.Data, m.ID)
		}
		ids, err := b.runPublish(ctx, keys, args, retry)
		if err == nil && len(ids) != len(part) {
			err = fmt.Errorf("%d entry ids for %d messages", len(ids), len(part))
		}
		if err != nil {
			return nil, fmt.Errorf("redis: xadd: %w", err)
		}
		for _, id := range ids {
			cursors = append(cursors, CursorPrefixRedis+id)
		}
	}
	return cursors, nil
}

// runPublish calls publishMany by its hash, and by its source when the
// server does not know it (a restarted server forgets scripts; NOSCRIPT
// means nothing ran). retry says whether go-redis may send the call again
// after a lost connection.
func (b *Redis) runPublish(ctx context.Context, keys []string, args []any, retry bool) ([]string, error) {
	call := func(verb, script string) *redis.Cmd {
		c := make([]any, 0, 3+len(keys)+len(args))
		c = append(c, verb, script, len(keys))
		for _, k := range keys {
			c = append(c, k)
		}
		c = append(c, args...)
		cmd := redis.NewCmd(ctx, c...)
		if retry {
			_ = b.rdb.Process(ctx, cmd)
		} else {
			_ = b.rdb.Process(ctx, noRetryCmd{cmd})
		}
		return cmd
	}
	cmd := call("evalsha", publishMany.Hash())
	if err := cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd = call("eval", publishManySrc)
	}
	return cmd.StringSlice()
}

// publishPart is the most messages one publishMany call takes: a script
// runs alone on the server, and 1,000 appends keep it to about a
// millisecond.
const publishPart = 1000

// dedupKey is where the entry id published with a publish id is remembered. It starts with the
// stream key, so it shares the stream's hash tag and slot on Redis Cluster
// (a script may only touch keys of one slot).
func (b *Redis) dedupKey(id string) string { return b.cfg.Stream + ":dedup:" + id }

// highWaterKey is the hash that maps each writer to the publish id of the
// last message it appended (see LastID). It starts with the stream key,
// for the same slot.
func (b *Redis) highWaterKey() string { return b.cfg.Stream + ":last-id" }

// latestKey is the index Latest reads: a hash that maps each subject to
// the id of its newest entry, set by the script of every append
// (publishMany, appendOnce) in the same step as the XADD, so that it never
// names an entry older than the stream's newest on that subject. It starts
// with the stream key, for the same slot.
//
// Its cost is one field per subject with an entry in the stream, and
// those of trimmed entries not pruned yet (see pruneLatestSrc): 82 bytes
// per subject of ~10 bytes in BenchmarkLatest (MEMORY USAGE, Redis 7.0),
// so about 70 beside the subject's own length: ~9 MB for 100,000
// subjects of 20 bytes. Every append also pays an HSET.
func (b *Redis) latestKey() string { return b.cfg.Stream + ":latest" }

// pruneKey holds the HSCAN cursor of the index's prune (pruneLatestSrc),
// kept between appends. It starts with the stream key, for the same slot.
func (b *Redis) pruneKey() string { return b.cfg.Stream + ":latest-prune" }

// pruneLatestSrc defines prune, which the append scripts run after their
// XADDs on a trimmed stream: it reads the next few fields of the index
// from a cursor kept in pruneKey and deletes those whose entry is before
// the stream's first (trimmed by MAXLEN), so that the index shrinks with
// the stream instead of keeping a field per subject ever published.
//
// Why in the scripts: the cost is amortized, pruneRatio fields examined
// per message appended, in the step that grows the index, with no
// goroutine to own and nothing to run on a stream nobody appends to. A
// full HSCAN pass meets every field present throughout it and the index
// gains at most one field per append, so a pass of H fields adds at most
// H/pruneRatio stale ones: the index stays within about pruneRatio/
// (pruneRatio-1) times the stream's length (TestRedisLatestIndexPruned
// saw under 1.8). It runs only while the index holds more fields than
// the stream holds entries (HLEN and XLEN are O(1)): the index of a few
// busy subjects costs an append nothing more. Entries XDEL'd from the
// middle are not its business (Latest forgets those it meets; fanwire
// never deletes entries).
//
// Its messages are stored before it runs: every command it sends may
// fail (an ACL of an older fanwire without +hlen, a cursor key changed by
// hand) and it then stops, failing nothing.
//
// prune's arguments: stream, index, cursor key; n fields to examine.
const pruneLatestSrc = `
local pruneRatio = 2
local function entryID(s)
  local ms, seq = string.match(s, '^(%d+)-(%d+)$')
  if ms then
    return tonumber(ms), tonumber(seq)
  end
end
local function try(...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    return nil
  end
  return r
end
local function prune(stream, index, cursorKey, n)
  local h, x = try('HLEN', index), try('XLEN', stream)
  if n <= 0 or not h or not x or h <= x then
    return
  end
  local first = try('XRANGE', stream, '-', '+', 'COUNT', 1)
  if not first or not first[1] then
    return
  end
  local fms, fseq = entryID(first[1][1])
  local cur = try('GET', cursorKey)
  if type(cur) ~= 'string' then
    cur = '0'
  end
  local r = try('HSCAN', index, cur, 'COUNT', n)
  if not r then
    try('SET', cursorKey, '0') -- not a cursor: start again
    return
  end
  local kv = r[2]
  for i = 1, #kv, 2 do
    local ms, seq = entryID(kv[i + 1])
    if ms and (ms < fms or ms == fms and seq < fseq) then
      try('HDEL', index, kv[i])
    end
  end
  try('SET', cursorKey, r[1])
end
`

// publishManySrc appends messages in order, each unless its publish id
// was seen within the window, atomically (a script runs alone on the
// server, so two publishers racing with one id append once), and records
// each entry as its subject's newest in the index. It returns the entry
// ids: the original one for a repeat, which leaves the index as it is. An
// error (the server out of memory, say) ends it: the messages before are
// stored, none after. On a trimmed stream it then prunes the index.
//
// KEYS[1] stream, KEYS[2] the index, KEYS[3] the prune's cursor, KEYS[4...]
// each message's dedup key (the stream's own for a message without an id:
// never read); ARGV[1] max length (0: no trimming), ARGV[2] window in ms,
// then per message its subject, data and publish id ("" for none).
const publishManySrc = pruneLatestSrc + `
local maxlen = tonumber(ARGV[1])
local out = {}
local added = 0
local a, k = 3, 4
while a <= #ARGV do
  local pid = ARGV[a + 2]
  local id = false
  if pid ~= '' then
    id = redis.call('GET', KEYS[k])
  end
  if not id then
    if maxlen > 0 then
      id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 's', ARGV[a], 'd', ARGV[a + 1])
    else
      id = redis.call('XADD', KEYS[1], '*', 's', ARGV[a], 'd', ARGV[a + 1])
    end
    redis.call('HSET', KEYS[2], ARGV[a], id)
    added = added + 1
    if pid ~= '' then
      redis.call('SET', KEYS[k], id, 'PX', ARGV[2])
    end
  end
  out[#out + 1] = id
  a = a + 3
  k = k + 1
end
if maxlen > 0 then
  prune(KEYS[1], KEYS[2], KEYS[3], pruneRatio * added)
end
return out
`

var publishMany = redis.NewScript(publishManySrc)

// toMessage turns a stream entry into a Message; ok is false for entries
// not written by fanwire.
func toMessage(x redis.XMessage) (Message, bool) {
	s, ok1 := x.Values["s"].(string)
	d, ok2 := x.Values["d"].(string)
	if !ok1 || !ok2 {
		return Message{}, false
	}
	return Message{Subject: s, Data: []byte(d), Cursor: CursorPrefixRedis + x.ID}, true
}

// Consume reads the stream with one blocking XREAD loop from the last entry
// at start. A lost connection is retried every 250 ms; Ready reports it.
// Close ends it with ErrClosed.
func (b *Redis) Consume(ctx context.Context, h Handler, started func(start string)) error {
	last := "0-0"
	start := ""
	xs, err := b.rdb.XRevRangeN(ctx, b.cfg.Stream, "+", "-", 1).Result()
	if err != nil {
		return fmt.Errorf("redis: last entry of %q: %w", b.cfg.Stream, err)
	}
	if len(xs) == 1 {
		last, start = xs[0].ID, CursorPrefixRedis+xs[0].ID
	}
	if started != nil {
		started(start)
	}
	batch := make([]Message, 0, maxBatch)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		select {
		case <-b.closed:
			return ErrClosed
		default:
		}
		res, err := b.rdb.XRead(ctx, &redis.XReadArgs{
			Streams: []string{b.cfg.Stream, last},
			Count:   maxBatch,
			Block:   time.Second, // never 0: that blocks forever and ignores ctx
		}).Result()
		switch {
		case errors.Is(err, redis.Nil):
			b.up.Store(true)
			continue
		case err != nil:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			select { // a read cut short by Close, or refused after it
			case <-b.closed:
				return ErrClosed
			default:
			}
			if b.up.Swap(false) {
				b.log.Warn("redis read failed; retrying", zap.Error(err))
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-b.closed:
				return ErrClosed
			case <-time.After(250 * time.Millisecond):
			}
			continue
		}
		if !b.up.Swap(true) {
			b.log.Info("redis reads again")
		}
		arrived := time.Now()
		batch = batch[:0]
		for _, s := range res {
			for _, x := range s.Messages {
				last = x.ID
				if m, ok := toMessage(x); ok {
					batch = append(batch, m)
				}
			}
		}
		if len(batch) > 0 {
			h(batch, arrived)
			clear(batch)
		}
	}
}

// Replay reads (after, until] with XRANGE batches. It may deliver entries
// outside filters (Redis cannot filter by subject): callers match them.
func (b *Redis) Replay(ctx context.Context, _ []string, after, until string, h func([]Message) error) error {
	var a string
	if after != "" {
		var err error
		if a, err = ParseRedisCursor(after); err != nil {
			return err
		}
	}
	u, err := ParseRedisCursor(until)
	if err != nil {
		return err
	}
	info, err := b.rdb.XInfoStream(ctx, b.cfg.Stream).Result()
	if err != nil && strings.Contains(err.Error(), "no such key") {
		// Nothing was published yet: the stream is empty. A cursor is
		// then ahead of it; "from the first" replays nothing. (Reported
		// as a failed broker, a resume would wait for the key forever.)
		if a != "" {
			return fmt.Errorf("%w: %s is ahead of the stream (%q holds no event)", ErrBadCursor, after, b.cfg.Stream)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("redis: xinfo %q: %w", b.cfg.Stream, err)
	}
	if a != "" {
		ia, _ := parseStreamID(a)
		if lg, err := parseStreamID(info.LastGeneratedID); err == nil && ia.cmp(lg) > 0 {
			return fmt.Errorf("%w: %s is ahead of the stream (last is rs:%s)", ErrBadCursor, after, info.LastGeneratedID)
		}
		// XDEL'd entries past the cursor: max-deleted-entry-id is exact.
		// Trimming (MAXLEN) removes from the head without recording it:
		// a cursor before the first retained entry, on a stream that lost
		// entries, is taken as expired. (When the cursor was exactly the
		// last trimmed entry nothing was lost, but that cannot be told.)
		md, err := parseStreamID(info.MaxDeletedEntryID)
		expired := err == nil && md.cmp(ia) > 0
		if first, err := parseStreamID(info.FirstEntry.ID); err == nil && ia.cmp(first) < 0 && info.EntriesAdded > info.Length {
			expired = true
		}
		if expired {
			return fmt.Errorf("%w: %s is older than the oldest retained event (rs:%s)", ErrCursorExpired, after, info.FirstEntry.ID)
		}
	}
	iu, _ := parseStreamID(u)
	if a != "" {
		if ia, _ := parseStreamID(a); iu.cmp(ia) <= 0 {
			return nil
		}
	}
	start := "-"
	if a != "" {
		start = "(" + a
	}
	batch := make([]Message, 0, replayBatch)
	for {
		xs, err := b.rdb.XRangeN(ctx, b.cfg.Stream, start, u, replayBatch).Result()
		if err != nil {
			return fmt.Errorf("redis: xrange: %w", err)
		}
		if len(xs) == 0 {
			return nil
		}
		batch = batch[:0]
		for _, x := range xs {
			if m, ok := toMessage(x); ok {
				batch = append(batch, m)
			}
		}
		if len(batch) > 0 {
			if err := h(batch); err != nil {
				return err
			}
		}
		start = "(" + xs[len(xs)-1].ID
		if len(xs) < replayBatch {
			return nil
		}
	}
}

// Ready reports whether the server answered the last read.
func (b *Redis) Ready() bool { return b.up.Load() }

// Name returns "redis".
func (b *Redis) Name() string { return "redis" }

// Close closes the client, which ends a running Consume.
func (b *Redis) Close() error {
	b.closeOnce.Do(func() { close(b.closed) })
	return b.rdb.Close()
}
