package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// The event log is stored in blocks: the events one transaction appends
// (or a run of them, for a very large transaction) as one record with its
// first and last sequence numbers and its events compactly encoded. Every
// backend stores this shape, so that a log moves between them unchanged,
// and no event is a row of its own on the writer's path.
//
// A block's encoding is a header byte followed by its events in Seq order.
// The header is 1 for a block that ends its transaction's events (or may),
// 2 for one whose transaction's events continue in the next block. Each
// event is:
//
//	uvarint  Seq minus the previous event's (the first: minus the block's First)
//	varint   Time in Unix nanoseconds minus the previous event's (the first: minus 0; 0 is the zero time)
//	string   Type, Task, WorkID, Target (each a reference, below)
//	uvarint  Attempt
//	uvarint  len(Data)+1, then Data (0: no Data)
//
// A string reference is a uvarint k: 0 is "", 1..n the block's nth distinct
// string so far, and n+1 a new one, followed by its length (uvarint) and
// bytes. The events of a commit repeat their types, tasks and unit IDs,
// which this writes once.

// The header bytes of a block (see above).
const (
	blockEnds      = 1
	blockContinues = 2
)

// MaxBlockEvents is the most events a backend puts in one block; a larger
// transaction stores several.
const MaxBlockEvents = 1024

// ErrBadBlock reports an encoded block that cannot be decoded.
var ErrBadBlock = errors.New("runcue: store: malformed event block")

// BlockEncoder encodes events into a block. Its zero value is ready to
// use; Reset makes it ready for the next block, keeping its memory. It is
// not safe for simultaneous use.
type BlockEncoder struct {
	buf          []byte
	dict         map[string]uint64
	n            int
	first, prev  int64
	prevAt       int64
	minAt, maxAt int64
}

// Reset empties e for a new block.
func (e *BlockEncoder) Reset() {
	e.buf = e.buf[:0]
	clear(e.dict)
	e.n = 0
}

// Len returns the number of events added since the last Reset.
func (e *BlockEncoder) Len() int { return e.n }

// Add appends ev, whose Seq must be greater than every event's added since
// the last Reset.
func (e *BlockEncoder) Add(ev *Event) {
	if e.n == 0 {
		e.buf = append(e.buf[:0], blockEnds)
		e.first, e.prev, e.prevAt = ev.Seq, ev.Seq, 0
		if e.dict == nil {
			e.dict = make(map[string]uint64, 16)
		}
	}
	at := int64(0)
	if !ev.Time.IsZero() {
		at = ev.Time.UnixNano()
	}
	if e.n == 0 || at < e.minAt {
		e.minAt = at
	}
	if e.n == 0 || at > e.maxAt {
		e.maxAt = at
	}
	e.buf = binary.AppendUvarint(e.buf, uint64(ev.Seq-e.prev))
	e.buf = binary.AppendVarint(e.buf, at-e.prevAt)
	e.str(ev.Type)
	e.str(ev.Task)
	e.str(ev.WorkID)
	e.str(ev.Target)
	e.buf = binary.AppendUvarint(e.buf, uint64(ev.Attempt))
	if len(ev.Data) == 0 {
		e.buf = append(e.buf, 0)
	} else {
		e.buf = binary.AppendUvarint(e.buf, uint64(len(ev.Data))+1)
		e.buf = append(e.buf, ev.Data...)
	}
	e.prev, e.prevAt = ev.Seq, at
	e.n++
}

func (e *BlockEncoder) str(s string) {
	if s == "" {
		e.buf = append(e.buf, 0)
		return
	}
	if k, ok := e.dict[s]; ok {
		e.buf = binary.AppendUvarint(e.buf, k)
		return
	}
	k := uint64(len(e.dict)) + 1
	e.dict[s] = k
	e.buf = binary.AppendUvarint(e.buf, k)
	e.buf = binary.AppendUvarint(e.buf, uint64(len(s)))
	e.buf = append(e.buf, s...)
}

// Block returns the block of the events added since the last Reset;
// continues says that their transaction's events go on in the next block.
// Its Data is e's memory until the next Add or Reset.
func (e *BlockEncoder) Block(continues bool) EventBlock {
	if continues {
		e.buf[0] = blockContinues
	} else {
		e.buf[0] = blockEnds
	}
	return EventBlock{First: e.first, Last: e.prev, MinAt: e.minAt, MaxAt: e.maxAt, Data: e.buf}
}

// BlockContinues reports whether the transaction of the encoded block
// data has more events in the next block.
func BlockContinues(data []byte) bool {
	return len(data) > 0 && data[0] == blockContinues
}

// EventBlock is a stored block: the sequence numbers of its first and last
// events, the least and greatest of their times (Unix nanoseconds; 0 for
// the zero time), and the encoded events. Every Seq in [First, Last] that
// is in no block was never committed or was pruned.
type EventBlock struct {
	First, Last  int64
	MinAt, MaxAt int64
	Data         []byte
}

// DecodeBlock calls fn for each event of the block whose first event has
// sequence number first, in Seq order, until fn returns false. The event
// passed to fn is fn's to keep: its strings and Data are its own memory,
// not data's.
func DecodeBlock(first int64, data []byte, fn func(Event) bool) error {
	if len(data) == 0 || (data[0] != blockEnds && data[0] != blockContinues) {
		return ErrBadBlock
	}
	d := blockDecoder{data: data[1:]}
	seq, at := first, int64(0)
	for len(d.data) > 0 {
		var ev Event
		seq += int64(d.uvarint())
		at += d.varint()
		ev.Seq = seq
		if at != 0 {
			ev.Time = time.Unix(0, at)
		}
		ev.Type = d.str()
		ev.Task = d.str()
		ev.WorkID = d.str()
		ev.Target = d.str()
		ev.Attempt = int(d.uvarint())
		if n := d.uvarint(); n > 0 && d.err == nil {
			if n-1 > uint64(len(d.data)) {
				d.err = ErrBadBlock
			} else {
				ev.Data = append([]byte(nil), d.data[:n-1]...)
				d.data = d.data[n-1:]
			}
		}
		if d.err != nil {
			return fmt.Errorf("%w (after Seq %d)", d.err, seq-1)
		}
		if !fn(ev) {
			return nil
		}
	}
	return nil
}

type blockDecoder struct {
	data []byte
	dict []string
	err  error
}

func (d *blockDecoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.data)
	if n <= 0 {
		d.err = ErrBadBlock
		return 0
	}
	d.data = d.data[n:]
	return v
}

func (d *blockDecoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.data)
	if n <= 0 {
		d.err = ErrBadBlock
		return 0
	}
	d.data = d.data[n:]
	return v
}

func (d *blockDecoder) str() string {
	k := d.uvarint()
	switch {
	case d.err != nil || k == 0:
		return ""
	case k <= uint64(len(d.dict)):
		return d.dict[k-1]
	case k == uint64(len(d.dict))+1:
		n := d.uvarint()
		if d.err != nil || n > uint64(len(d.data)) {
			d.err = ErrBadBlock
			return ""
		}
		s := string(d.data[:n])
		d.data = d.data[n:]
		d.dict = append(d.dict, s)
		return s
	}
	d.err = ErrBadBlock
	return ""
}

// The per-unit record: each unit keeps the sequence numbers of its own
// events, so that they are read without an index of the log by unit. An
// entry is a uvarint of Seq<<1|more: more says that the unit may have
// further events after Seq in the same transaction (a reader reads on to
// the transaction's end, see BlockContinues); a backend writes such an
// entry where it records a unit's events before it knows them all (a
// claim and its finish merged into one write). Entries are in Seq order;
// an entry may name a number that holds no event of the unit (a reader
// checks each event's WorkID). The record is bounded: once it holds
// MaxUnitRecord bytes, later events are not recorded, and a reader finds
// them by reading the log after the last entry.

// MaxUnitRecord is the most bytes of a unit's record of its events: about
// 200 entries.
const MaxUnitRecord = 1024

// A RecordEntry is one entry of a unit's record.
type RecordEntry struct {
	Seq  int64
	More bool
}

// AppendUnitRecord appends an entry to a unit's record rec.
func AppendUnitRecord(rec []byte, seq int64, more bool) []byte {
	v := uint64(seq) << 1
	if more {
		v |= 1
	}
	return binary.AppendUvarint(rec, v)
}

// UnitRecord decodes a unit's record: its entries, and whether it is full
// (events after the last entry may be missing from it).
func UnitRecord(rec []byte) (entries []RecordEntry, full bool, err error) {
	full = UnitRecordFull(len(rec))
	for len(rec) > 0 {
		v, n := binary.Uvarint(rec)
		if n <= 0 {
			return entries, true, ErrBadBlock
		}
		entries = append(entries, RecordEntry{Seq: int64(v >> 1), More: v&1 != 0})
		rec = rec[n:]
	}
	return entries, full, nil
}

// UnitRecordFull reports whether a record of n bytes takes no more.
func UnitRecordFull(n int) bool { return n >= MaxUnitRecord }
