package cdc

import (
	"hash/maphash"
	"strconv"
)

// memKeyMap maps row keys and index tuples (as tupleKey writes them) to row
// ids, without pointers. A key of one integer column is looked up by its
// value: in a dense array while the values are small (ids of a serial
// column: 0 up to a few times the entries), else in a map of int64s. Any
// other key is looked up by its hash, which two keys may share: the row
// found is then a candidate the caller checks. Looking orders' ids up in a
// map of hashes was 17% of composing and applying (random accesses, one
// cache miss each: BenchmarkMemDocuments); in the dense array a key is an
// index.
type memKeyMap struct {
	seed   maphash.Seed
	ints   bool              // the keys are one integer column's
	dense  []uint32          // ints: by value, the values under len(dense)
	sparse map[int64]uint32  // ints: the others
	hashed map[uint64]uint32 // by hash: keys of other types, and any integer written unlike its canonical text
	n      int               // entries in dense and sparse
}

func newMemKeyMap(seed maphash.Seed, ints bool) memKeyMap {
	return memKeyMap{seed: seed, ints: ints, sparse: make(map[int64]uint32), hashed: make(map[uint64]uint32)}
}

// isIntOID reports whether values of type oid are integers written as
// strconv writes an int64.
func isIntOID(oid uint32) bool {
	switch oid {
	case 20, 21, 23, 26: // int8, int2, int4, oid
		return true
	}
	return false
}

// intKey is the value of a one-column key holding an integer in its
// canonical text ("\x00V" then the digits, as strconv.FormatInt writes
// them: no sign but '-', no leading zero).
func intKey(k []byte) (int64, bool) {
	if len(k) < 3 || k[0] != 0 || k[1] != 'V' {
		return 0, false
	}
	s := k[2:]
	if s[0] == '+' || s[0] == '0' && len(s) > 1 || s[0] == '-' && (len(s) == 1 || s[1] == '0') {
		return 0, false
	}
	v, err := strconv.ParseInt(string(s), 10, 64)
	return v, err == nil
}

// get returns the first row id of key (0: none); exact says the entry is
// key's, not possibly another key's with the same hash.
func (m *memKeyMap) get(key []byte) (id uint32, exact bool) {
	if m.ints {
		if v, ok := intKey(key); ok {
			if v >= 0 && v < int64(len(m.dense)) {
				return m.dense[v], true
			}
			return m.sparse[v], true
		}
	}
	return m.hashed[maphash.Bytes(m.seed, key)], false
}

// set makes id the first row id of key.
func (m *memKeyMap) set(key []byte, id uint32) {
	if m.ints {
		if v, ok := intKey(key); ok {
			m.setInt(v, id)
			return
		}
	}
	m.hashed[maphash.Bytes(m.seed, key)] = id
}

func (m *memKeyMap) setInt(v int64, id uint32) {
	if v >= int64(len(m.dense)) && v < 4*int64(m.n+1)+1024 {
		m.grow(v)
	}
	if v >= 0 && v < int64(len(m.dense)) {
		if m.dense[v] == 0 {
			m.n++
		}
		m.dense[v] = id
		return
	}
	if _, ok := m.sparse[v]; !ok {
		m.n++
	}
	m.sparse[v] = id
}

// grow makes the dense array cover v (and twice what it covered), moving
// the values it now covers out of sparse.
func (m *memKeyMap) grow(v int64) {
	old := int64(len(m.dense))
	size := max(v+1, 2*old, 1024)
	dense := make([]uint32, size)
	copy(dense, m.dense)
	m.dense = dense
	for k, id := range m.sparse {
		if k >= old && k < size {
			dense[k] = id
			delete(m.sparse, k)
		}
	}
}

// del removes key.
func (m *memKeyMap) del(key []byte) {
	if m.ints {
		if v, ok := intKey(key); ok {
			if v >= 0 && v < int64(len(m.dense)) {
				if m.dense[v] != 0 {
					m.n--
				}
				m.dense[v] = 0
			} else if _, ok := m.sparse[v]; ok {
				m.n--
				delete(m.sparse, v)
			}
			return
		}
	}
	delete(m.hashed, maphash.Bytes(m.seed, key))
}
