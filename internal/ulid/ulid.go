// Package ulid makes unique, lexically time-ordered identifiers.
//
// An identifier is 26 characters of Crockford base32 encoding 48 bits of
// Unix milliseconds followed by 80 bits that are random for the first
// identifier of a millisecond and incremented for each later one, so that
// identifiers made by one Generator sort in the order they were made.
package ulid

import (
	"crypto/rand"
	"encoding/binary"
	"sync"
	"time"
)

const alphabet = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// Generator makes identifiers. It is safe for simultaneous use by multiple
// goroutines.
type Generator struct {
	mu     sync.Mutex
	lastMs uint64
	hi     uint16 // top 16 bits of the 80-bit entropy
	lo     uint64 // low 64 bits
}

// New returns an identifier for time t. If t is not after the time of the
// previous identifier, the previous identifier's time is reused and its
// entropy incremented, so identifiers never go backwards.
func (g *Generator) New(t time.Time) string {
	ms := uint64(t.UnixMilli())
	g.mu.Lock()
	if ms <= g.lastMs {
		ms = g.lastMs
		g.lo++
		if g.lo == 0 {
			g.hi++
			if g.hi == 0 { // 2^80 identifiers in one millisecond: move to the next one
				ms++
				g.reseed()
			}
		}
	} else {
		g.reseed()
	}
	g.lastMs = ms
	hi, lo := g.hi, g.lo
	g.mu.Unlock()
	return encode(ms, hi, lo)
}

func (g *Generator) reseed() {
	var b [10]byte
	_, _ = rand.Read(b[:])                         // crypto/rand.Read never fails on supported platforms
	g.hi = binary.BigEndian.Uint16(b[:2]) & 0x7fff // headroom so increments rarely carry into the time
	g.lo = binary.BigEndian.Uint64(b[2:])
}

func encode(ms uint64, hi uint16, lo uint64) string {
	// 128 bits: 48 bits time, 16 bits hi, 64 bits lo; 26 base32 characters
	// carry 130 bits, the first character holding the top 3.
	var out [26]byte
	// Work on the 128-bit value as two uint64 halves: H = time<<16 | hi, L = lo.
	h := ms<<16 | uint64(hi)
	l := lo
	for i := 25; i >= 0; i-- {
		out[i] = alphabet[l&31]
		l = l>>5 | h<<59
		h >>= 5
	}
	return string(out[:])
}
