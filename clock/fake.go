package clock

import (
	"context"
	"sync"
	"time"
)

// Fake is a Clock whose time moves only when told to. Advance and Set move
// the wall and the monotonic clock together and fire the timers that come
// due; StepWall moves the wall clock alone, as setting a system's time does,
// and fires nothing.
//
// A Fake is safe for simultaneous use by multiple goroutines.
type Fake struct {
	mu      sync.Mutex
	now     time.Time     // wall clock
	mono    time.Duration // monotonic clock
	timers  map[*fakeTimer]struct{}
	changed chan struct{} // closed and replaced whenever the set of timers changes
}

// NewFake returns a Fake clock whose wall clock reads t and whose monotonic
// clock reads zero.
func NewFake(t time.Time) *Fake {
	return &Fake{now: t, timers: make(map[*fakeTimer]struct{}), changed: make(chan struct{})}
}

// Now returns the fake wall-clock time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Monotonic returns the fake monotonic time.
func (f *Fake) Monotonic() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mono
}

// NewTimer returns a timer that fires once the monotonic clock has advanced
// by d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{f: f, c: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

// Advance moves both clocks forward by d (a d of zero or less does nothing)
// and fires every timer that is due.
func (f *Fake) Advance(d time.Duration) {
	if d <= 0 {
		return
	}
	f.mu.Lock()
	f.advanceLocked(d)
	f.mu.Unlock()
}

// Set moves both clocks forward until the wall clock reads t, and fires
// every timer that is due. A t that is not after the wall clock's reading
// does nothing: use StepWall to set the wall clock back.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	if t.After(f.now) {
		f.advanceLocked(t.Sub(f.now))
	}
	f.mu.Unlock()
}

// StepWall moves the wall clock alone by d, forwards or backwards, as when
// the system's time is set. The monotonic clock and the timers do not see
// it.
func (f *Fake) StepWall(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

func (f *Fake) advanceLocked(d time.Duration) {
	f.now = f.now.Add(d)
	f.mono += d
	for tm := range f.timers {
		if tm.when <= f.mono {
			delete(f.timers, tm)
			tm.fire(f.now)
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

// NextDeadline returns the wall-clock time at which the earliest waiting
// timer fires if only Advance or Set move the clocks, and false when no
// timer waits.
func (f *Fake) NextDeadline() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	first := true
	var next time.Duration
	for tm := range f.timers {
		if first || tm.when < next {
			next, first = tm.when, false
		}
	}
	if first {
		return time.Time{}, false
	}
	return f.now.Add(next - f.mono), true
}

// WaitForTimer blocks until some timer is waiting that would fire by the
// time the wall clock reads t (if only Advance or Set move the clocks), or
// ctx ends. Tests use it to know that a component has armed the timer they
// are about to fire.
func (f *Fake) WaitForTimer(ctx context.Context, t time.Time) error {
	for {
		f.mu.Lock()
		ch := f.changed
		at := f.mono + t.Sub(f.now)
		for tm := range f.timers {
			if tm.when <= at {
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
	when time.Duration // on the monotonic clock
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
	t.when = t.f.mono + d
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
