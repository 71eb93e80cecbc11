package cdc

import (
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fanwire/fanwire/cdc/pgjson"
	"github.com/jackc/pgx/v5/pgtype"
)

// The memory state's table against a plain map of its rows: random
// inserts, replacements (moving rows between index lists or not),
// removals and a truncate, with keys and join values of one integer column
// (the dense arrays and their int64 map: small, large, negative values,
// and texts that are not canonical integers) and of text (by hash); after
// each step every row is found by its key and by each index as the map
// says, rows handed out earlier keep their bytes (the arena is compacted
// underneath), and the counts agree.
func TestMemTableAgainstAMap(t *testing.T) {
	t.Parallel()
	for _, pkType := range []uint32{pgtype.Int8OID, pgtype.TextOID} {
		t.Run(fmt.Sprint(pkType), func(t *testing.T) {
			col := func(oid uint32) catalogColumn { return catalogColumn{oid: oid, ctype: pgjson.Type{OID: oid}} }
			ct := &catalogTable{cols: map[string]catalogColumn{"id": col(pkType), "parent": col(pgtype.Int4OID), "tag": col(pgtype.TextOID), "v": col(pgtype.TextOID)}, pkey: []string{"id"}}
			st := &memState{tables: map[string]*memTable{}, seed: maphash.MakeSeed()}
			tab := newMemTable(st, "public.t", []string{"id", "parent", "tag", "v"}, ct)
			byParent := tab.index([]string{"parent"})
			byTag := tab.index([]string{"tag"})
			rng := rand.New(rand.NewPCG(1, 2))
			value := func() string {
				switch rng.IntN(8) {
				case 0:
					return strconv.FormatInt(-rng.Int64N(1000), 10)
				case 1:
					return strconv.FormatInt(rng.Int64(), 10)
				case 2:
					return "0" + strconv.Itoa(rng.IntN(100)) // not as PostgreSQL writes an integer: by hash
				}
				return strconv.Itoa(rng.IntN(3000))
			}
			model := map[string][][]byte{} // key → values
			type held struct{ row, want []byte }
			var handed []held
			compactions := 0
			for step := range 30_000 {
				used := tab.arena.used
				switch r := rng.IntN(100); {
				case step == 15_000:
					tab.reset()
					clear(model)
					used = 0
				case r < 60:
					id := value()
					vals := [][]byte{[]byte(id), []byte(strconv.Itoa(rng.IntN(500))), []byte("tag" + strconv.Itoa(rng.IntN(50))), []byte(strconv.Itoa(step) + strings.Repeat(".", rng.IntN(2000)))}
					if rng.IntN(10) == 0 {
						vals[1] = nil // NULL joins nothing
					}
					enc := encodeRow(vals)
					key := tab.appendKey(nil, enc)
					var row []byte
					if oid := tab.find(key); oid != 0 {
						row = tab.replace(oid, tab.row(oid), enc)
					} else {
						row = tab.insert(key, enc)
					}
					model[string(key)] = vals
					if len(handed) < 1000 {
						handed = append(handed, held{row, enc})
					}
				default:
					for k := range model {
						id := tab.find([]byte(k))
						if id == 0 {
							t.Fatalf("step %d: %q not found", step, k)
						}
						tab.remove(id, []byte(k))
						delete(model, k)
						break
					}
				}
				if tab.arena.used < used {
					compactions++
				}
				if step%97 != 0 {
					continue
				}
				if tab.n != len(model) || st.rows.Load() != int64(len(model)) {
					t.Fatalf("step %d: %d rows (counted %d), want %d", step, tab.n, st.rows.Load(), len(model))
				}
				var valueBytes int64
				parents, tags := map[string][]string{}, map[string][]string{}
				for k, vals := range model {
					id := tab.find([]byte(k))
					if id == 0 || string(tab.row(id)) != string(encodeRow(vals)) {
						t.Fatalf("step %d: key %q: found %d", step, k, id)
					}
					valueBytes += int64(len(encodeRow(vals)))
					if vals[1] != nil {
						parents[string(vals[1])] = append(parents[string(vals[1])], string(vals[3]))
					}
					tags[string(vals[2])] = append(tags[string(vals[2])], string(vals[3]))
				}
				if st.bytes.Load() != valueBytes {
					t.Fatalf("step %d: %d value bytes counted, want %d", step, st.bytes.Load(), valueBytes)
				}
				for _, c := range []struct {
					ix   *memIndex
					want map[string][]string
				}{{byParent, parents}, {byTag, tags}} {
					for v, want := range c.want {
						var got []string
						for _, row := range c.ix.appendRows(nil, appendTupleValue(nil, []byte(v))) {
							got = append(got, string(rowField(row, 3)))
						}
						slices.Sort(got)
						slices.Sort(want)
						if !slices.Equal(got, want) {
							t.Fatalf("step %d: index on %v, %q: rows %v, want %v", step, c.ix.cols, v, got, want)
						}
					}
				}
				if got := byParent.appendRows(nil, appendTupleValue(nil, []byte("100000"))); len(got) != 0 {
					t.Fatalf("step %d: rows of a parent no row has: %d", step, len(got))
				}
				for _, h := range handed {
					if string(h.row) != string(h.want) {
						t.Fatalf("step %d: a row handed out changed: %q, was %q", step, h.row, h.want)
					}
				}
			}
			if compactions == 0 {
				t.Fatal("the arena was never compacted")
			}
			t.Logf("%d compactions", compactions)
		})
	}
}

// The dense array of integer keys grows as values come, keeps the values
// it covers out of the int64 map, and misses what it does not hold.
func TestMemKeyMapIntegers(t *testing.T) {
	t.Parallel()
	m := newMemKeyMap(maphash.MakeSeed(), true)
	key := func(s string) []byte { return appendTupleValue(nil, []byte(s)) }
	want := map[string]uint32{}
	for i := uint32(1); i <= 5000; i++ {
		for _, s := range []string{strconv.Itoa(int(i) * 3), "-" + strconv.Itoa(int(i)), strconv.Itoa(int(i) * 1_000_003), "00" + strconv.Itoa(int(i))} {
			m.set(key(s), i)
			want[s] = i
		}
	}
	if len(m.dense) < 15001 {
		t.Fatalf("dense array of %d values: 3..15000 should be in it", len(m.dense))
	}
	for s, id := range want {
		got, exact := m.get(key(s))
		if got != id || exact != (s[0] != '0') {
			t.Fatalf("%q: %d (exact %v), want %d", s, got, exact, id)
		}
	}
	for _, s := range []string{"1", "15001", "-0", "-5001", "+3", "x"} {
		if got, _ := m.get(key(s)); got != 0 {
			t.Fatalf("%q: %d, want none", s, got)
		}
	}
	for s := range want {
		m.del(key(s))
	}
	if m.n != 0 || len(m.sparse) != 0 || len(m.hashed) != 0 {
		t.Fatalf("after deleting every key: %d entries, %d sparse, %d hashed", m.n, len(m.sparse), len(m.hashed))
	}
}
