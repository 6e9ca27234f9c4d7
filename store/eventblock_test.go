package store

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBlockRoundTrip encodes random runs of events (gaps in Seq, times
// going back, repeated and empty strings, nil and empty Data) and decodes
// them back unchanged; a block cut anywhere fails to decode, never
// panics. Seeds are logged.
func TestBlockRoundTrip(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		rnd := rand.New(rand.NewPCG(seed, 7))
		var e BlockEncoder
		for range 3 {
			e.Reset()
			n := 1 + rnd.IntN(300)
			seq := int64(1 + rnd.IntN(1<<40))
			at := time.Unix(0, rnd.Int64N(1<<62))
			words := []string{"", "work_started", "work_completed", "a", "b", "unit-1", "unit-\x00é", "https://x/y"}
			want := make([]Event, n)
			for i := range want {
				seq += int64(1 + rnd.IntN(3)*rnd.IntN(2))
				at = at.Add(time.Duration(rnd.Int64N(int64(time.Second))) - 100*time.Millisecond)
				ev := Event{Seq: seq, Time: at, Type: words[rnd.IntN(len(words))], Task: words[rnd.IntN(len(words))],
					WorkID: words[rnd.IntN(len(words))], Target: words[rnd.IntN(len(words))], Attempt: rnd.IntN(1000)}
				if rnd.IntN(5) == 0 {
					ev.Time = time.Time{}
				}
				if rnd.IntN(2) == 0 {
					ev.Data = []byte(`{"k":` + words[rnd.IntN(len(words))] + `}`)
				}
				want[i] = ev
				e.Add(&want[i])
			}
			b := e.Block(seed%2 == 0)
			assert.Equal(t, seed%2 == 0, BlockContinues(b.Data))
			require.Equal(t, want[0].Seq, b.First, "seed %d", seed)
			require.Equal(t, want[n-1].Seq, b.Last, "seed %d", seed)
			var got []Event
			require.NoError(t, DecodeBlock(b.First, b.Data, func(ev Event) bool { got = append(got, ev); return true }), "seed %d", seed)
			require.Len(t, got, n, "seed %d", seed)
			for i := range want {
				w, g := want[i], got[i]
				assert.Equal(t, w.Seq, g.Seq, "seed %d event %d", seed, i)
				assert.True(t, w.Time.Equal(g.Time), "seed %d event %d: %v != %v", seed, i, w.Time, g.Time)
				assert.Equal(t, [4]string{w.Type, w.Task, w.WorkID, w.Target}, [4]string{g.Type, g.Task, g.WorkID, g.Target}, "seed %d event %d", seed, i)
				assert.Equal(t, w.Attempt, g.Attempt)
				assert.Equal(t, w.Data, g.Data)
				if !w.Time.IsZero() {
					assert.LessOrEqual(t, b.MinAt, w.Time.UnixNano())
					assert.GreaterOrEqual(t, b.MaxAt, w.Time.UnixNano())
				}
			}
			// Cut short anywhere: an error, never a panic.
			for cut := 0; cut < len(b.Data); cut += 1 + rnd.IntN(7) {
				err := DecodeBlock(b.First, b.Data[:cut], func(Event) bool { return true })
				if cut == 0 {
					assert.ErrorIs(t, err, ErrBadBlock)
				}
			}
		}
	}
}

// TestBlockStopsEarly: DecodeBlock stops when fn says so.
func TestBlockStopsEarly(t *testing.T) {
	var e BlockEncoder
	for i := range 10 {
		e.Add(&Event{Seq: int64(5 + i), Type: "t"})
	}
	n := 0
	require.NoError(t, DecodeBlock(5, e.Block(false).Data, func(ev Event) bool { n++; return ev.Seq < 7 }))
	assert.Equal(t, 3, n)
}

// TestUnitRecord: entries round-trip; the record reports full at
// MaxUnitRecord bytes.
func TestUnitRecord(t *testing.T) {
	var rec []byte
	var want []RecordEntry
	for seq := int64(1); ; seq += 1 << 20 {
		if UnitRecordFull(len(rec)) {
			break
		}
		more := seq%3 == 0
		rec = AppendUnitRecord(rec, seq, more)
		want = append(want, RecordEntry{seq, more})
	}
	got, full, err := UnitRecord(rec)
	require.NoError(t, err)
	assert.True(t, full)
	assert.Equal(t, want, got)
	got, full, err = UnitRecord(AppendUnitRecord(nil, 42, false))
	require.NoError(t, err)
	assert.False(t, full)
	assert.Equal(t, []RecordEntry{{42, false}}, got)
}
