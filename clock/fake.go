package clock

import (
	"context"
	"sync"
	"time"
)

// Fake is a Clock whose time moves only when told to. Timers fire when
// Advance or Set moves the time to or past their deadline.
//
// A Fake is safe for simultaneous use by multiple goroutines.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	timers  map[*fakeTimer]struct{}
	changed chan struct{} // closed and replaced whenever the set of timers changes
}

// NewFake returns a Fake clock reading t.
func NewFake(t time.Time) *Fake {
	return &Fake{now: t, timers: make(map[*fakeTimer]struct{}), changed: make(chan struct{})}
}

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer that fires once the fake time reaches Now()+d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{f: f, c: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

// Advance moves the time forward by d and fires every timer that is due.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	f.setLocked(f.now.Add(d))
	f.mu.Unlock()
}

// Set moves the time to t (which may not be before the current fake time)
// and fires every timer that is due.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	if t.After(f.now) {
		f.setLocked(t)
	}
	f.mu.Unlock()
}

func (f *Fake) setLocked(t time.Time) {
	f.now = t
	for tm := range f.timers {
		if !tm.when.After(t) {
			delete(f.timers, tm)
			tm.fire(t)
		}
	}
	f.notifyLocked()
}

func (f *Fake) notifyLocked() {
	close(f.changed)
	f.changed = make(chan struct{})
}

// Timers returns the number of timers waiting to fire.
func (f *Fake) Timers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// NextDeadline returns the earliest deadline of a waiting timer, and false
// when no timer waits.
func (f *Fake) NextDeadline() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var next time.Time
	for tm := range f.timers {
		if next.IsZero() || tm.when.Before(next) {
			next = tm.when
		}
	}
	return next, !next.IsZero()
}

// WaitForTimer blocks until some timer is waiting whose deadline is at or
// before t, or ctx ends. Tests use it to know that a component has armed the
// timer they are about to fire.
func (f *Fake) WaitForTimer(ctx context.Context, t time.Time) error {
	for {
		f.mu.Lock()
		ch := f.changed
		for tm := range f.timers {
			if !tm.when.After(t) {
				f.mu.Unlock()
				return nil
			}
		}
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

type fakeTimer struct {
	f    *Fake
	c    chan time.Time
	when time.Time
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) fire(now time.Time) {
	select {
	case t.c <- now:
	default:
	}
}

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	_, active := t.f.timers[t]
	delete(t.f.timers, t)
	t.drain()
	if active {
		t.f.notifyLocked()
	}
	return active
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	_, active := t.f.timers[t]
	t.drain()
	t.when = t.f.now.Add(d)
	if d <= 0 {
		delete(t.f.timers, t)
		t.fire(t.f.now)
	} else {
		t.f.timers[t] = struct{}{}
	}
	t.f.notifyLocked()
	return active
}

func (t *fakeTimer) drain() {
	select {
	case <-t.c:
	default:
	}
}
