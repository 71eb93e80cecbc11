package loadtest

import (
	"fmt"
	"testing"
)

func TestVerifier(t *testing.T) {
	type counts struct{ delivered, gaps, dups, late, alien, missing int64 }
	tests := []struct {
		name     string
		events   int
		seqs     []uint64
		want     counts
		complete bool
	}{
		{"in order", 5, []uint64{1, 2, 3, 4, 5}, counts{5, 0, 0, 0, 0, 0}, true},
		{"nothing", 5, nil, counts{0, 0, 0, 0, 0, 5}, false},
		{"one lost in the middle", 5, []uint64{1, 2, 4, 5}, counts{4, 1, 0, 0, 0, 1}, false},
		{"lost at the end", 5, []uint64{1, 2, 3}, counts{3, 0, 0, 0, 0, 2}, false},
		{"lost at the start", 5, []uint64{3, 4, 5}, counts{3, 2, 0, 0, 0, 2}, false},
		{"swapped pair", 5, []uint64{1, 3, 2, 4, 5}, counts{5, 1, 0, 1, 0, 0}, true},
		{"duplicate in place", 5, []uint64{1, 2, 2, 3, 4, 5}, counts{6, 0, 1, 0, 0, 0}, true},
		{"stale duplicate", 5, []uint64{1, 2, 3, 1, 4, 5}, counts{6, 0, 1, 0, 0, 0}, true},
		{"replay from the start", 3, []uint64{1, 2, 3, 1, 2, 3}, counts{6, 0, 3, 0, 0, 0}, true},
		{"late arrival then its duplicate", 4, []uint64{1, 3, 4, 2, 2}, counts{5, 1, 1, 1, 0, 0}, true},
		{"outside the range", 3, []uint64{0, 1, 2, 3, 4, 99}, counts{6, 0, 0, 0, 3, 0}, true},
		{"word boundaries", 130, seqRange(1, 130), counts{130, 0, 0, 0, 0, 0}, true},
		{"gap across a word", 130, append(seqRange(1, 60), seqRange(70, 130)...), counts{121, 9, 0, 0, 0, 9}, false},
		{"reverse", 4, []uint64{4, 3, 2, 1}, counts{4, 3, 0, 3, 0, 0}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := newVerifier(tt.events)
			for _, s := range tt.seqs {
				v.observe(s)
			}
			got := counts{v.delivered, v.gaps, v.dups, v.late, v.alien, v.missing()}
			if got != tt.want {
				t.Errorf("counts = %+v, want %+v", got, tt.want)
			}
			if v.complete() != tt.complete {
				t.Errorf("complete = %v, want %v", v.complete(), tt.complete)
			}
		})
	}
}

func seqRange(from, to uint64) []uint64 {
	var s []uint64
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

// TestVerifierInvariants checks, over many shuffled streams, that the counts
// always add up: every delivery is new, a duplicate or alien, and every
// published event is either seen or missing.
func TestVerifierInvariants(t *testing.T) {
	for trial := range 50 {
		t.Run(fmt.Sprint(trial), func(t *testing.T) {
			const events = 200
			v := newVerifier(events)
			x := uint64(trial*7919 + 1)
			for range 300 {
				x = x*6364136223846793005 + 1442695040888963407 // LCG: deterministic, no math/rand seeding
				v.observe(x >> 33 % (events + 2))
			}
			if v.delivered != v.distinct+v.dups+v.alien {
				t.Errorf("delivered %d != distinct %d + dups %d + alien %d", v.delivered, v.distinct, v.dups, v.alien)
			}
			if v.distinct+v.missing() != events {
				t.Errorf("distinct %d + missing %d != %d", v.distinct, v.missing(), events)
			}
			if v.late > v.gaps {
				t.Errorf("late %d > gaps %d: every late arrival fills a recorded gap", v.late, v.gaps)
			}
			if want := int64(v.last) - v.distinct + v.late; v.gaps != want {
				t.Errorf("gaps %d, want last %d - distinct %d + late %d = %d", v.gaps, v.last, v.distinct, v.late, want)
			}
		})
	}
}

// TestMultiVerifier checks several publishers' runs (3 publishers × 4
// events: 1-4, 5-8, 9-12): interleaving publishers is no disorder, a gap or
// swap within one publisher's run is.
func TestMultiVerifier(t *testing.T) {
	type counts struct{ delivered, gaps, dups, late, alien, missing int64 }
	tests := []struct {
		name     string
		seqs     []uint64
		want     counts
		complete bool
	}{
		{"publishers interleaved", []uint64{9, 1, 5, 2, 10, 6, 3, 11, 7, 4, 8, 12}, counts{12, 0, 0, 0, 0, 0}, true},
		{"one publisher after another, backwards", append(append(seqRange(9, 12), seqRange(5, 8)...), seqRange(1, 4)...), counts{12, 0, 0, 0, 0, 0}, true},
		{"gap in one publisher", []uint64{1, 2, 4, 5, 6, 7, 8}, counts{7, 1, 0, 0, 0, 5}, false},
		{"first of a publisher lost", []uint64{1, 6, 7, 8}, counts{4, 1, 0, 0, 0, 8}, false},
		{"swap in one publisher", []uint64{1, 2, 3, 4, 5, 7, 6, 8, 9, 10, 11, 12}, counts{12, 1, 0, 1, 0, 0}, true},
		{"duplicate", []uint64{9, 9, 1}, counts{3, 0, 1, 0, 0, 10}, false},
		{"outside every run", []uint64{0, 13}, counts{2, 0, 0, 0, 2, 12}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := newMultiVerifier(3, 4)
			for _, s := range tt.seqs {
				v.observe(s)
			}
			got := counts{v.delivered, v.gaps, v.dups, v.late, v.alien, v.missing()}
			if got != tt.want {
				t.Errorf("counts = %+v, want %+v", got, tt.want)
			}
			if v.complete() != tt.complete {
				t.Errorf("complete = %v, want %v", v.complete(), tt.complete)
			}
		})
	}
}

// TestStrideVerifier checks a view's client (3 clients, client 1: events
// 2, 5, 8, 11 of 12 are its 1-4): the others' events are alien, and gaps,
// duplicates and order are counted in its own numbering.
func TestStrideVerifier(t *testing.T) {
	type counts struct{ delivered, gaps, dups, late, alien, missing int64 }
	tests := []struct {
		name     string
		seqs     []uint64
		want     counts
		complete bool
	}{
		{"its events in order", []uint64{2, 5, 8, 11}, counts{4, 0, 0, 0, 0, 0}, true},
		{"one skipped", []uint64{2, 8, 11}, counts{3, 1, 0, 0, 0, 1}, false},
		{"swapped", []uint64{2, 8, 5, 11}, counts{4, 1, 0, 1, 0, 0}, true},
		{"twice", []uint64{2, 5, 5, 8, 11}, counts{5, 0, 1, 0, 0, 0}, true},
		{"another client's", []uint64{1, 2, 3, 5, 8, 11}, counts{6, 0, 0, 0, 2, 0}, true},
		{"zero and past the end", []uint64{0, 2, 5, 8, 11, 14}, counts{6, 0, 0, 0, 2, 0}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := newStrideVerifier(4, 3, 1)
			for _, s := range tt.seqs {
				v.observe(s)
			}
			got := counts{v.delivered, v.gaps, v.dups, v.late, v.alien, v.missing()}
			if got != tt.want {
				t.Errorf("counts = %+v, want %+v", got, tt.want)
			}
			if v.complete() != tt.complete {
				t.Errorf("complete = %v, want %v", v.complete(), tt.complete)
			}
		})
	}
}
