// Package hub distributes committed events to subscribers.
//
// Published events go into a bounded ring shared by every subscriber. Each
// subscriber has its own goroutine and cursor: it reads from the ring while
// it keeps up, and from the store's durable log, a page at a time, when it
// falls behind. Publish never waits for a subscriber, and a subscriber's
// memory is bounded by the ring and one page.
//
// Durable events carry a sequence number (Seq > 0); the writer publishes
// them contiguously. Ephemeral events (Seq == 0) live only in the ring: a
// subscriber that falls behind the ring skips the ephemeral ones it missed.
package hub

import (
	"context"
	"sync"
	"time"

	"github.com/runcue/runcue/store"
)

const page = 256

type entry struct {
	pos uint64 // position in publication order, from 1
	ev  store.Event
}

// Hub is safe for simultaneous use by multiple goroutines.
type Hub struct {
	st store.Store

	mu      sync.Mutex
	ring    []entry
	head    int // index of the oldest entry
	n       int
	pos     uint64 // position of the newest entry
	lastSeq int64
	changed chan struct{}
	closed  bool
	done    chan struct{}
	watch   map[string]chan struct{}
	subs    sync.WaitGroup

	// BeforeSend, when set, is called by a subscriber before each send; tests
	// use it to stall a subscriber.
	BeforeSend func()
}

// New returns a Hub holding up to size events, whose sequence numbers
// continue after lastSeq.
func New(st store.Store, size int, lastSeq int64) *Hub {
	if size < 16 {
		size = 16
	}
	return &Hub{st: st, ring: make([]entry, size), lastSeq: lastSeq, changed: make(chan struct{}),
		done: make(chan struct{}), watch: make(map[string]chan struct{})}
}

// LastSeq returns the highest sequence number published.
func (h *Hub) LastSeq() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lastSeq
}

// Publish appends events in order. It never blocks on subscribers.
func (h *Hub) Publish(evs []store.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return
	}
	for _, ev := range evs {
		h.pos++
		i := (h.head + h.n) % len(h.ring)
		if h.n == len(h.ring) {
			h.head = (h.head + 1) % len(h.ring)
		} else {
			h.n++
		}
		h.ring[i] = entry{pos: h.pos, ev: ev}
		if ev.Seq > 0 {
			h.lastSeq = ev.Seq
		}
		if ev.WorkID != "" {
			if ch, ok := h.watch[ev.WorkID]; ok {
				close(ch)
				delete(h.watch, ev.WorkID)
			}
		}
	}
	close(h.changed)
	h.changed = make(chan struct{})
}

// Changed returns a channel closed at the next Publish or Close.
func (h *Hub) Changed() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return h.done
	}
	return h.changed
}

// Watch returns a channel closed when the next event for work unit id is
// published, or the hub closes.
func (h *Hub) Watch(id string) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return h.done
	}
	ch, ok := h.watch[id]
	if !ok {
		ch = make(chan struct{})
		h.watch[id] = ch
	}
	return ch
}

// Done returns a channel closed when the hub closes.
func (h *Hub) Done() <-chan struct{} { return h.done }

// Close ends every subscription and waits for their goroutines.
func (h *Hub) Close() {
	h.mu.Lock()
	if !h.closed {
		h.closed = true
		close(h.done)
		close(h.changed)
		for id, ch := range h.watch {
			close(ch)
			delete(h.watch, id)
		}
	}
	h.mu.Unlock()
	h.subs.Wait()
}

// Subscription options.
type Options struct {
	// After is the sequence number to resume after; events with a higher
	// Seq are delivered. Negative means "from now".
	After int64
	// Accept filters events; nil accepts all.
	Accept func(*store.Event) bool
	// Types and Tasks, when set, are the filter Accept applies, for the
	// store: reads from the durable log fetch only matching events (an
	// indexed query), so a narrow subscription far behind does not read
	// the whole log.
	Types, Tasks []string
	// Buffer is the capacity of the returned channel.
	Buffer int
	// Gap, when set, is called when the events between the cursor and the
	// first stored one were deleted; it returns an event to deliver in
	// their place.
	Gap func(after, first int64) store.Event
	// OnClose, when set, is called when the subscription ends.
	OnClose func()
}

// Subscribe delivers events, converted by conv, on the returned channel
// until ctx ends or the hub closes, then closes the channel.
func Subscribe[T any](ctx context.Context, h *Hub, o Options, conv func(*store.Event) T) <-chan T {
	out := make(chan T, o.Buffer)
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		close(out)
		if o.OnClose != nil {
			o.OnClose()
		}
		return out
	}
	s := &sub[T]{h: h, ctx: ctx, o: o, out: out, conv: conv, cursor: o.After}
	if o.After < 0 || o.After >= h.lastSeq {
		// From now (or ahead of us): attach at the ring's end.
		if o.After < 0 {
			s.cursor = h.lastSeq
		}
		s.attached, s.lastPos = o.After <= h.lastSeq, h.pos
	}
	h.subs.Add(1)
	h.mu.Unlock()
	go s.run()
	return out
}

type sub[T any] struct {
	h        *Hub
	ctx      context.Context
	o        Options
	out      chan T
	conv     func(*store.Event) T
	cursor   int64  // last durable Seq delivered (or skipped)
	lastPos  uint64 // last ring position consumed, when attached
	attached bool
}

func (s *sub[T]) run() {
	defer s.h.subs.Done()
	defer close(s.out)
	if s.o.OnClose != nil {
		defer s.o.OnClose()
	}
	buf := make([]store.Event, 0, page)
	var backoff time.Duration // the pause before a failed read is tried again
	for {
		buf = buf[:0]
		wait, fromStore, ok := s.next(&buf)
		if !ok {
			return
		}
		if fromStore && (len(s.o.Types) > 0 || len(s.o.Tasks) > 0) {
			evs, more, err := s.matching()
			if err != nil {
				// The store failed (an outage) or ctx ended; retry at a
				// change or after a pause, whichever comes first.
				if !s.retry(&backoff) {
					return
				}
				continue
			}
			backoff = 0
			if !more && len(evs) == 0 {
				if !s.await(wait) {
					return
				}
				continue
			}
			buf = append(buf, evs...)
		} else if fromStore {
			// Read before the events: what was published by then was
			// committed by then, so it is stored unless deleted.
			published := s.h.LastSeq()
			evs, err := s.h.st.EventsAfter(s.ctx, s.cursor, page)
			if err != nil {
				if !s.retry(&backoff) {
					return
				}
				continue
			}
			backoff = 0
			// Sequence numbers are contiguous, so a jump means the events
			// in between were pruned by retention.
			if s.o.Gap != nil && len(evs) > 0 && evs[0].Seq > s.cursor+1 {
				if !s.send(s.o.Gap(s.cursor, evs[0].Seq)) {
					return
				}
			}
			if len(evs) == 0 {
				if published > s.cursor {
					// Published before the read, yet none stored:
					// retention deleted every event past the cursor.
					if s.o.Gap != nil && !s.send(s.o.Gap(s.cursor, published+1)) {
						return
					}
					s.cursor = published
					continue
				}
				// Nothing stored beyond the cursor yet: wait for the ring.
				if !s.await(wait) {
					return
				}
				continue
			}
			buf = append(buf, evs...)
		}
		for i := range buf {
			ev := &buf[i]
			if ev.Seq < 0 { // matching's marker: nothing else matches up to -Seq
				s.cursor = max(s.cursor, -ev.Seq)
				continue
			}
			if ev.Seq > 0 {
				if ev.Seq <= s.cursor {
					continue
				}
				s.cursor = ev.Seq
			}
			if s.o.Accept != nil && !s.o.Accept(ev) {
				continue
			}
			if !s.send(*ev) {
				return
			}
		}
		if len(buf) == 0 && wait != nil {
			select {
			case <-s.ctx.Done():
				return
			case <-wait:
			}
		}
	}
}

// await waits for ch; it reports false when the subscription's context
// ended first.
// retry waits, after a failed read of the store, for a change, for ctx,
// or for a pause that doubles from 50 ms to 2 s (*backoff): a store that
// comes back from an outage with nothing new to publish is read again
// all the same. It returns false when ctx ended.
func (s *sub[T]) retry(backoff *time.Duration) bool {
	*backoff = min(max(2**backoff, 50*time.Millisecond), 2*time.Second)
	t := time.NewTimer(*backoff)
	defer t.Stop()
	select {
	case <-s.ctx.Done():
		return false
	case <-s.h.Changed():
		return true
	case <-t.C:
		return true
	}
}

func (s *sub[T]) await(ch <-chan struct{}) bool {
	select {
	case <-s.ctx.Done():
		return false
	case <-ch:
		return true
	}
}

// matching reads the next page of events matching the subscription's
// filter from the store, up to the last sequence number published. Events
// that do not match are skipped by moving the cursor: when the page is not
// full, every match up to that number has been read. A retention gap
// (events deleted past the cursor) is delivered first. more reports that
// the cursor moved, whether or not anything matched.
func (s *sub[T]) matching() (evs []store.Event, more bool, err error) {
	upto := s.h.LastSeq()
	if upto <= s.cursor {
		return nil, false, nil
	}
	first, err := s.h.st.FirstSeq(s.ctx)
	if err != nil {
		return nil, false, err
	}
	if first == 0 {
		first = upto + 1 // everything published was deleted
	}
	if first > s.cursor+1 {
		if s.o.Gap != nil && !s.send(s.o.Gap(s.cursor, first)) {
			return nil, false, s.ctx.Err()
		}
		s.cursor = first - 1
		if s.cursor >= upto {
			return nil, true, nil
		}
	}
	evs, err = s.h.st.MatchingEvents(s.ctx, store.EventQuery{After: s.cursor, Upto: upto, Types: s.o.Types, Tasks: s.o.Tasks, Limit: page})
	if err != nil {
		return nil, false, err
	}
	if len(evs) < page {
		// Every match up to upto is in evs: the cursor may pass the rest.
		// The loop delivers evs and leaves the cursor at the last of them;
		// move it to upto once they are sent.
		if len(evs) == 0 {
			s.cursor = upto
			return nil, true, nil
		}
		evs = append(evs, store.Event{Seq: -upto}) // a marker: advance the cursor to upto
	}
	return evs, true, nil
}

func (s *sub[T]) send(ev store.Event) bool {
	if f := s.h.BeforeSend; f != nil {
		f()
	}
	select {
	case s.out <- s.conv(&ev):
		return true
	case <-s.ctx.Done():
		return false
	case <-s.h.done:
		return false
	}
}

// next copies what the ring holds for the subscriber into buf. It returns a
// channel to wait on when there is nothing new, or fromStore when the
// subscriber must read the durable log instead.
func (s *sub[T]) next(buf *[]store.Event) (wait <-chan struct{}, fromStore bool, ok bool) {
	h := s.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed || s.ctx.Err() != nil {
		return nil, false, false
	}
	oldest := h.pos - uint64(h.n) + 1 // position of the oldest entry held
	if s.attached && s.lastPos+1 < oldest {
		s.attached = false // overrun: the ring dropped entries we had not read
	}
	if !s.attached {
		// Attach right after the cursor's event, so that the ephemeral
		// events published since are delivered. Only a durable entry can
		// be the cursor's: an ephemeral one has Seq 0, like a cursor that
		// has delivered nothing yet.
		pos, found := uint64(0), false
		if s.cursor > 0 {
			for k := h.n - 1; k >= 0; k-- {
				if e := &h.ring[(h.head+k)%len(h.ring)]; e.ev.Seq == s.cursor {
					pos, found = e.pos, true
					break
				}
			}
		}
		switch {
		case found:
			s.attached, s.lastPos = true, pos
		case s.cursor == h.lastSeq:
			// The ring no longer holds the cursor's event: everything it
			// holds is newer.
			s.attached, s.lastPos = true, oldest-1
		default:
			// Behind the ring (or ahead of the log): read the store.
			return h.changed, true, true
		}
	}
	start := s.lastPos + 1
	if start > h.pos {
		return h.changed, false, true
	}
	for p := start; p <= h.pos && len(*buf) < page; p++ {
		e := &h.ring[(h.head+int(p-oldest))%len(h.ring)]
		*buf = append(*buf, e.ev)
		s.lastPos = p
	}
	return nil, false, true
}
