package cdc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/subject"
	"go.uber.org/zap"
)

// An ingest is one writer of events: its slot on its database system.
// Ingests sharing a stream (and a prefix) tell their events apart by the
// writer name that starts each id (eventid.go), so each finds its own
// high-water mark (highwater.go); and they register, in the broker, the
// subjects they publish on, so that two that would publish the same ones
// are refused at start instead of mixing their events. Every leader of
// one slot is the same writer.

// writerName is the writer name of slot on the database system systemID
// (IDENTIFY_SYSTEM's decimal identifier): "<slot>.<system id in base 36>".
// A restore into a new cluster (a new identifier) is another writer.
func writerName(slot, systemID string) (string, error) {
	id, err := strconv.ParseUint(systemID, 10, 64)
	if err != nil {
		return "", fmt.Errorf("postgres: system identifier %q: %w", systemID, err)
	}
	return slot + "." + strconv.FormatUint(id, 36), nil
}

// subjectsOf are the patterns the events of a table or projection whose
// subject is subject (under prefix) go to: its keys, and its error events.
func subjectsOf(prefix, subject string) []string {
	return []string{subject + ".*", errorSubject(prefix, subject)}
}

// writerTTL is how long a writer's registration holds after its last
// renewal: a writer that stopped (or died) longer ago no longer keeps
// another from its subjects. It renews every third of it.
const writerTTL = 30 * time.Second

// writerRecord is a writer's entry in the registry.
type writerRecord struct {
	Slot     string   `json:"slot"`
	System   string   `json:"system"`
	Database string   `json:"database"`
	Host     string   `json:"host,omitempty"`
	Prefix   string   `json:"prefix"`
	Subjects []string `json:"subjects"`
	// Past are the subjects it published on before (a table renamed or no
	// longer published): its mark may still be there.
	Past []string `json:"past,omitempty"`
	// Stored: the broker has stored events of it, so a mark it cannot
	// find was lost (purged, expired, evicted), not never there.
	Stored bool      `json:"stored,omitempty"`
	Until  time.Time `json:"alive_until"`
}

// String names the writer for errors and logs.
func (w *writerRecord) String() string {
	s := fmt.Sprintf("the ingest of slot %q on database %q (system %s", w.Slot, w.Database, w.System)
	if w.Host != "" {
		s += ", " + w.Host
	}
	return s + ")"
}

// registryDoc is the registry: every writer of the stream, by name.
type registryDoc struct {
	Writers map[string]*writerRecord `json:"writers"`
}

// registration is this ingest's record in the broker's registry.
type registration struct {
	reg  broker.Registry // static
	name string          // static
	log  *zap.Logger     // static
	mu   sync.Mutex      // serializes updates (start-up, the reader, the keeper)
	rec  writerRecord    // guarded by mu: what was last stored
}

// errWriterConflict wraps the refusal of a writer whose subjects another
// live writer publishes on.
var errWriterConflict = errors.New("two ingests would publish the same subjects")

// update applies change to this writer's record in the registry, checks
// that no other live writer publishes on its subjects, and stores it,
// again while another writer changes the document at the same time.
func (r *registration) update(ctx context.Context, change func(rec *writerRecord)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for attempt := 0; ; attempt++ {
		raw, rev, err := r.reg.LoadRegistry(ctx)
		if err != nil {
			return err
		}
		doc := registryDoc{Writers: map[string]*writerRecord{}}
		if raw != nil {
			if err := json.Unmarshal(raw, &doc); err != nil {
				return fmt.Errorf("broker: the writers' registry is not what fanwire writes: %w", err)
			}
			if doc.Writers == nil {
				doc.Writers = map[string]*writerRecord{}
			}
		}
		rec := r.rec
		if old := doc.Writers[r.name]; old != nil {
			rec.Past = mergeSubjects(old.Past, old.Subjects, rec.Past)
			rec.Stored = rec.Stored || old.Stored
		}
		change(&rec)
		rec.Past = slices.DeleteFunc(rec.Past, func(s string) bool { return slices.Contains(rec.Subjects, s) })
		now := time.Now()
		for name, other := range doc.Writers {
			if name == r.name || !other.Until.After(now) {
				continue
			}
			for _, a := range rec.Subjects {
				for _, b := range other.Subjects {
					if subject.Overlap(a, b) {
						return fmt.Errorf("%w: %s and %s would both publish %s: give one another --prefix, or leave the table to one of them (--tables, --config)", errWriterConflict, other, &rec, b)
					}
				}
			}
		}
		doc.Writers[r.name] = &rec
		out, err := json.Marshal(doc)
		if err != nil {
			return err
		}
		if _, err := r.reg.StoreRegistry(ctx, out, rev); err != nil {
			if errors.Is(err, broker.ErrConflict) && attempt < 50 {
				continue // another writer changed it meanwhile: read it again
			}
			return err
		}
		r.rec = rec
		return nil
	}
}

// mergeSubjects is the union of lists, in order, each once.
func mergeSubjects(lists ...[]string) []string {
	var out []string
	for _, l := range lists {
		for _, s := range l {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// subjects are every subject the writer publishes or published on.
func (r *registration) subjects() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return mergeSubjects(r.rec.Subjects, r.rec.Past)
}

// stored reports whether the broker has stored events of the writer.
func (r *registration) stored() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec.Stored
}

// add registers more subjects (a table created, renamed or added to the
// publication), before the first event on them is published.
func (r *registration) add(ctx context.Context, subjects []string) error {
	r.mu.Lock()
	missing := slices.ContainsFunc(subjects, func(s string) bool { return !slices.Contains(r.rec.Subjects, s) })
	r.mu.Unlock()
	if !missing {
		return nil
	}
	return r.update(ctx, func(rec *writerRecord) {
		rec.Subjects = mergeSubjects(rec.Subjects, subjects)
		rec.Until = time.Now().Add(writerTTL)
	})
}

// keep renews the registration every third of writerTTL until ctx is
// done, recording when the broker has stored events of the writer
// (published says whether it has). A renewal that finds another live
// writer on its subjects (it took them while this one was away) calls
// lost; other failures are logged and tried again.
func (r *registration) keep(ctx context.Context, published func() bool, lost func(error)) {
	tick := time.NewTicker(writerTTL / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		err := r.update(ctx, func(rec *writerRecord) {
			rec.Until = time.Now().Add(writerTTL)
			rec.Stored = rec.Stored || published()
		})
		switch {
		case errors.Is(err, errWriterConflict):
			lost(errFatal{err})
			return
		case err != nil && ctx.Err() == nil:
			r.log.Warn("ingest: renewing this ingest's registration in the broker", zap.Error(err))
		}
	}
}

// release ends the registration at once (the ingest stops): another
// writer may take its subjects without waiting for writerTTL.
func (r *registration) release(ctx context.Context) {
	err := r.update(ctx, func(rec *writerRecord) { rec.Until = time.Time{} })
	if err != nil && !errors.Is(err, errWriterConflict) {
		r.log.Warn("ingest: releasing this ingest's registration in the broker", zap.Error(err))
	}
}

// hostOf names the PostgreSQL server of a connection for the registry.
func hostOf(host string, port uint16) string {
	if strings.HasPrefix(host, "/") {
		return host // a socket directory
	}
	return host + ":" + strconv.Itoa(int(port))
}
