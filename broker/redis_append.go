package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Append appends msgs in order, as Publish does, without their cursors
// (see Appender), and sets the writer's high-water mark (LastID) to the
// last one stored. The stream holds a prefix of msgs: a part the server
// refused refuses every part after it (ErrConflict). With opts.Check the
// writer's mark must be opts.Last, or nothing is stored (ErrConflict). A
// pipeline of a writer's parts, or one holding a message without an id,
// is not sent again after a connection error: Append returns the error,
// and the writer learns from LastID what is stored. How and what it
// costs: docs/architecture.md, "Redis Streams: Publish and Append".
func (b *Redis) Append(ctx context.Context, msgs []Outgoing, opts AppendOptions) error {
	if err := CheckWriter(opts.Writer); err != nil {
		return fmt.Errorf("redis: append: %w", err)
	}
	if len(msgs) == 0 {
		return nil
	}
	pipe := b.rdb.Pipeline()
	var cmds []*redis.Cmd
	check, last := opts.Check, opts.Last
	for start := 0; start < len(msgs); start += appendScriptMax {
		part := msgs[start:min(start+appendScriptMax, len(msgs))]
		// KEYS: the stream, the high-water hash, the index of each
		// subject's newest entry and its prune's cursor, then a dedup key
		// per message (the stream's own for one without an id: never
		// read).
		keys := make([]string, 4, 4+len(part))
		keys[0], keys[1], keys[2], keys[3] = b.cfg.Stream, b.highWaterKey(), b.latestKey(), b.pruneKey()
		checkArg := "0"
		if check && opts.Writer != "" {
			checkArg = "1"
		}
		args := make([]any, 5, 5+3*len(part))
		args[0], args[1], args[2], args[3], args[4] = b.cfg.MaxLen, b.cfg.DedupWindow.Milliseconds(), opts.Writer, checkArg, last
		retry := opts.Writer == ""
		for _, m := range part {
			if m.ID == "" {
				retry = false
				keys = append(keys, b.cfg.Stream)
			} else {
				keys = append(keys, b.dedupKey(m.ID))
				last = m.ID
			}
			args = append(args, m.Subject, m.Data, m.ID)
		}
		check = true // the next part checks against this one
		var cmd *redis.Cmd
		if start == 0 {
			// EVAL first, which caches the script for the EVALSHAs after it
			// (see Publish on why not SCRIPT LOAD).
			cmd = redis.NewCmd(ctx, append([]any{"eval", appendOnceSrc, len(keys)}, append(toAny(keys), args...)...)...)
		} else {
			cmd = redis.NewCmd(ctx, append([]any{"evalsha", appendOnce.Hash(), len(keys)}, append(toAny(keys), args...)...)...)
		}
		if retry {
			_ = pipe.Process(ctx, cmd)
		} else {
			_ = pipe.Process(ctx, noRetryCmd{cmd})
		}
		cmds = append(cmds, cmd)
	}
	if _, err := pipe.Exec(ctx); err != nil && !isConflict(err) {
		return fmt.Errorf("redis: append: %w", err)
	}
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			if isConflict(err) {
				return fmt.Errorf("redis: append: %w: %s", ErrConflict, strings.TrimPrefix(err.Error(), "CONFLICT "))
			}
			return fmt.Errorf("redis: append: %w", err)
		}
	}
	return nil
}

// isConflict reports whether err is the append script's refusal.
func isConflict(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "CONFLICT ")
}

func toAny(s []string) []any {
	a := make([]any, len(s))
	for i, v := range s {
		a[i] = v
	}
	return a
}

// noRetryCmd marks a command go-redis must not send again: a pipeline
// holding one is not retried after a connection error.
type noRetryCmd struct{ *redis.Cmd }

func (noRetryCmd) NoRetry() bool { return true }

// appendScriptMax is the most messages one append script call takes: the
// server runs nothing else meanwhile (about a millisecond for 256 XADDs).
const appendScriptMax = 256

// appendOnceSrc is publishManySrc for the messages of one writer: each
// is appended unless its publish id was seen within the window (and, when
// appended, recorded as its subject's newest entry in the index), and the
// writer's high-water mark is set once, to the publish id of the last
// message stored (appended, or a repeat of one stored before: a writer
// sends in order, and sends again only what it does not know is stored),
// also when an XADD fails (the script then stops there and returns its
// error): the mark never lags what is stored, nor names a message that is
// not.
//
// With check, the writer's mark must be the expected id ("": none), or
// the call is refused with an error starting "CONFLICT", before it stores
// anything. On a trimmed stream a call that stored all of its messages
// then prunes the index (pruneLatestSrc).
//
// KEYS[1] stream, KEYS[2] high-water hash, KEYS[3] the index of each
// subject's newest entry (latestKey), KEYS[4] the prune's cursor
// (pruneKey), KEYS[4+i] message i's dedup key; ARGV[1] max length (0: no
// trimming), ARGV[2] window in ms, ARGV[3] the writer ("": none), ARGV[4]
// check ("1") or not, ARGV[5] the expected mark, then per message:
// subject, data, publish id ("" for none).
const appendOnceSrc = pruneLatestSrc + `
local maxlen = tonumber(ARGV[1])
local writer = ARGV[3]
if ARGV[4] == '1' then
  local cur = redis.call('HGET', KEYS[2], writer) or ''
  if cur ~= ARGV[5] then
    return redis.error_reply('CONFLICT writer ' .. writer .. ': its last stored id is "' .. cur .. '", not "' .. ARGV[5] .. '"')
  end
end
local last = nil
local function mark()
  if last and writer ~= '' then
    redis.call('HSET', KEYS[2], writer, last)
  end
end
local added = 0
local a, k = 6, 5
while a <= #ARGV do
  local pid = ARGV[a + 2]
  if pid == '' or redis.call('EXISTS', KEYS[k]) == 0 then
    local id
    if maxlen > 0 then
      id = redis.pcall('XADD', KEYS[1], 'MAXLEN', '~', maxlen, '*', 's', ARGV[a], 'd', ARGV[a + 1])
    else
      id = redis.pcall('XADD', KEYS[1], '*', 's', ARGV[a], 'd', ARGV[a + 1])
    end
    if type(id) == 'table' and id.err then
      mark()
      return id
    end
    redis.call('HSET', KEYS[3], ARGV[a], id)
    added = added + 1
    if pid ~= '' then
      redis.call('SET', KEYS[k], id, 'PX', ARGV[2])
    end
  end
  if pid ~= '' then
    last = pid
  end
  a = a + 3
  k = k + 1
end
mark()
if maxlen > 0 then
  prune(KEYS[1], KEYS[3], KEYS[4], pruneRatio * added)
end
return k - 5
`

var appendOnce = redis.NewScript(appendOnceSrc)

// LastID returns the id of the last message writer appended (see
// HighWater): its field of the high-water hash.
func (b *Redis) LastID(ctx context.Context, writer string, _ []string) (string, error) {
	id, err := b.rdb.HGet(ctx, b.highWaterKey(), writer).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("redis: last id of writer %q: %w", writer, err)
	}
	return id, nil
}

// registryKey holds the registry document (see Registry) and its
// revision. It starts with the stream key, for the stream's slot.
func (b *Redis) registryKey() string { return b.cfg.Stream + ":registry" }

// LoadRegistry returns the registry document and its revision.
func (b *Redis) LoadRegistry(ctx context.Context) ([]byte, uint64, error) {
	vals, err := b.rdb.HMGet(ctx, b.registryKey(), "doc", "rev").Result()
	if err != nil {
		return nil, 0, fmt.Errorf("redis: registry: %w", err)
	}
	doc, _ := vals[0].(string)
	rev, _ := vals[1].(string)
	if rev == "" {
		return nil, 0, nil
	}
	var n uint64
	if _, err := fmt.Sscan(rev, &n); err != nil {
		return nil, 0, fmt.Errorf("redis: registry: revision %q: %w", rev, err)
	}
	return []byte(doc), n, nil
}

// StoreRegistry replaces the registry document if its revision is still
// rev, atomically (storeRegistrySrc).
func (b *Redis) StoreRegistry(ctx context.Context, doc []byte, rev uint64) (uint64, error) {
	n, err := storeRegistry.Run(ctx, b.rdb, []string{b.registryKey()}, doc, rev).Uint64()
	if isConflict(err) {
		return 0, fmt.Errorf("redis: registry: %w: changed since revision %d", ErrConflict, rev)
	}
	if err != nil {
		return 0, fmt.Errorf("redis: registry: %w", err)
	}
	return n, nil
}

// storeRegistrySrc sets the registry's document (ARGV[1]) if its revision
// is ARGV[2] (0: none yet), and returns the new one.
var storeRegistry = redis.NewScript(`
local rev = tonumber(redis.call('HGET', KEYS[1], 'rev') or '0')
if rev ~= tonumber(ARGV[2]) then
  return redis.error_reply('CONFLICT registry revision ' .. rev)
end
redis.call('HSET', KEYS[1], 'doc', ARGV[1], 'rev', rev + 1)
return rev + 1
`)
