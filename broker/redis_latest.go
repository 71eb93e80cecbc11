package broker

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/fanwire/fanwire/subject"
)

// Latest reads the newest stored message of each subject on filters (see
// Snapshots) from the index the append scripts keep (latestKey), and
// returns through, the stream's last entry read before the index: a
// subject appended to after through is left out, for the Replay after
// through to deliver. An entry trimmed away is skipped and forgotten.
// Entries appended by anything but Publish and Append (a plain XADD) are
// not in the index. With a limit, a set of more than limit entries is
// refused before any is fetched. How: docs/architecture.md, "Redis
// Streams: Latest".
func (b *Redis) Latest(ctx context.Context, filters []string, limit int, h func([]Message) error) (string, error) {
	xs, err := b.rdb.XRevRangeN(ctx, b.cfg.Stream, "+", "-", 1).Result()
	if err != nil {
		return "", fmt.Errorf("redis: last entry of %q: %w", b.cfg.Stream, err)
	}
	if len(xs) == 0 {
		return "", nil // no stream yet, or nothing left in it
	}
	through := CursorPrefixRedis + xs[0].ID
	top, err := parseStreamID(xs[0].ID)
	if err != nil {
		return "", fmt.Errorf("redis: last entry of %q: %w", b.cfg.Stream, err)
	}
	if b.latest.afterThrough != nil {
		b.latest.afterThrough()
	}
	found, err := b.scanLatest(ctx, filters, top, limit)
	if err != nil {
		return "", err
	}
	if b.latest.afterScan != nil {
		b.latest.afterScan()
	}
	batch := make([]Message, 0, latestPage)
	var gone []any // subject, entry id of each entry found gone
	for len(found) > 0 {
		page := found[:min(latestPage, len(found))]
		found = found[len(page):]
		pipe := b.rdb.Pipeline()
		cmds := make([]*redis.XMessageSliceCmd, len(page))
		for i, e := range page {
			cmds[i] = pipe.XRangeN(ctx, b.cfg.Stream, e.entry, e.entry, 1)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return "", fmt.Errorf("redis: latest: xrange: %w", err)
		}
		batch, gone = batch[:0], gone[:0]
		for i, c := range cmds {
			xs := c.Val()
			if len(xs) == 0 {
				gone = append(gone, page[i].subject, page[i].entry)
				continue
			}
			if m, ok := toMessage(xs[0]); ok {
				batch = append(batch, m)
			}
		}
		if len(gone) > 0 {
			if err := forgetGone.Run(ctx, b.rdb, []string{b.latestKey()}, gone...).Err(); err != nil {
				return "", fmt.Errorf("redis: latest: forget trimmed entries: %w", err)
			}
		}
		if len(batch) > 0 {
			if err := h(batch); err != nil {
				return "", err
			}
			clear(batch)
		}
	}
	return through, nil
}

// latestEntry is one field of the index: a subject and its newest entry.
type latestEntry struct {
	id      streamID
	entry   string // the id as the stream writes it
	subject string
}

// scanLatest reads the index's fields on filters whose entry is at or
// before top, sorted by entry, each once; more than limit (> 0) of them
// is an error.
func (b *Redis) scanLatest(ctx context.Context, filters []string, top streamID, limit int) ([]latestEntry, error) {
	match := ""
	if len(filters) == 1 {
		match = subjectGlob(filters[0])
	}
	var found []latestEntry
	var cursor uint64
	for {
		kv, next, err := b.rdb.HScan(ctx, b.latestKey(), cursor, match, latestScan).Result()
		if err != nil {
			return nil, fmt.Errorf("redis: latest: hscan %q: %w", b.latestKey(), err)
		}
		for i := 0; i+1 < len(kv); i += 2 {
			subj, entry := kv[i], kv[i+1]
			if len(filters) > 0 && !slices.ContainsFunc(filters, func(f string) bool { return subject.Match(f, subj) }) {
				continue
			}
			id, err := parseStreamID(entry)
			if err != nil || id.cmp(top) > 0 {
				continue // not an entry id (not ours), or after through
			}
			found = append(found, latestEntry{id: id, entry: entry, subject: subj})
		}
		if b.latest.scanned != nil {
			b.latest.scanned(len(found))
		}
		if limit > 0 && len(found) > limit {
			// Over the limit, unless HSCAN returned some twice.
			if found = sortEntries(found); len(found) > limit {
				return nil, snapshotTooLarge(limit, filters)
			}
		}
		if next == 0 {
			break
		}
		cursor = next
	}
	return sortEntries(found), nil
}

// sortEntries sorts entries by id and drops repeats. A field HSCAN
// returned twice (the hash was resized meanwhile) named the same entry
// both times, if at or before through: a change since through names an
// entry after it, which scanLatest skips.
func sortEntries(found []latestEntry) []latestEntry {
	slices.SortFunc(found, func(x, y latestEntry) int { return x.id.cmp(y.id) })
	return slices.CompactFunc(found, func(x, y latestEntry) bool { return x.id == y.id })
}

// subjectGlob is the HSCAN MATCH glob of the subjects pattern may match:
// its tokens up to the first wildcard, literally, then anything ("" for
// a pattern that starts with one). It lets through more than the pattern
// ('*' there spans dots): the caller matches each subject.
func subjectGlob(pattern string) string {
	var g strings.Builder
	for tok, rest, more := subject.Next(pattern); ; tok, rest, more = subject.Next(rest) {
		if tok == "*" || tok == ">" {
			if g.Len() == 0 {
				return ""
			}
			g.WriteByte('*')
			return g.String()
		}
		for _, c := range []byte(tok) {
			if strings.IndexByte(`*?[]\`, c) >= 0 {
				g.WriteByte('\\')
			}
			g.WriteByte(c)
		}
		if !more {
			return g.String()
		}
		g.WriteByte('.')
	}
}

// forgetGone deletes the index fields of entries found gone from the
// stream, each only if it still names that entry: a subject appended to
// since has a field naming its new entry, which stays.
//
// KEYS[1] the index; ARGV: subject, entry id, for each entry.
var forgetGone = redis.NewScript(`
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    n = n + redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return n
`)

const (
	// latestScan is HSCAN's COUNT: about this many fields per round trip.
	latestScan = 1000
	// latestPage is how many entries one round trip fetches, and the
	// most one call of Latest's handler gets.
	latestPage = 256
)
