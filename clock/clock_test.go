package clock

import (
	"context"
	"testing"
	"time"
)

func TestFakeTimers(t *testing.T) {
	t0 := time.Unix(1000, 0)
	f := NewFake(t0)
	a := f.NewTimer(time.Second)
	b := f.NewTimer(3 * time.Second)
	if f.Timers() != 2 {
		t.Fatalf("timers %d", f.Timers())
	}
	if next, _ := f.NextDeadline(); !next.Equal(t0.Add(time.Second)) {
		t.Fatalf("next %v", next)
	}
	f.Advance(999 * time.Millisecond)
	select {
	case <-a.C():
		t.Fatal("fired early")
	default:
	}
	f.Advance(time.Millisecond)
	if got := <-a.C(); !got.Equal(t0.Add(time.Second)) {
		t.Fatalf("fired with %v", got)
	}
	if a.Stop() {
		t.Fatal("Stop of a fired timer reports true")
	}
	if !b.Reset(time.Second) {
		t.Fatal("Reset of an active timer reports false")
	}
	f.Set(t0.Add(1500 * time.Millisecond))
	select {
	case <-b.C():
		t.Fatal("reset timer fired early")
	default:
	}
	if !b.Stop() {
		t.Fatal("Stop of an active timer reports false")
	}
	f.Advance(time.Hour)
	select {
	case <-b.C():
		t.Fatal("stopped timer fired")
	default:
	}
	f.Set(t0) // backwards: ignored
	if !f.Now().Equal(t0.Add(time.Hour + 1500*time.Millisecond)) {
		t.Fatalf("now %v", f.Now())
	}
	c := f.NewTimer(0)
	select {
	case <-c.C():
	default:
		t.Fatal("a zero timer fires at once")
	}
}

func TestWaitForTimer(t *testing.T) {
	f := NewFake(time.Unix(0, 0))
	done := make(chan error, 1)
	go func() { done <- f.WaitForTimer(context.Background(), time.Unix(5, 0)) }()
	f.NewTimer(10 * time.Second) // too late: does not satisfy the wait
	f.NewTimer(4 * time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := NewFake(time.Unix(0, 0)).WaitForTimer(ctx, time.Unix(1, 0)); err == nil {
		t.Fatal("want the context's error")
	}
}

func TestReal(t *testing.T) {
	c := Real()
	if !IsReal(c) || IsReal(NewFake(time.Now())) {
		t.Fatal("IsReal")
	}
	tm := c.NewTimer(time.Millisecond)
	<-tm.C()
}

func TestFakeStepWall(t *testing.T) {
	t0 := time.Unix(1000, 0)
	f := NewFake(t0)
	tm := f.NewTimer(10 * time.Second)
	f.StepWall(-time.Hour)
	if got := f.Now(); !got.Equal(t0.Add(-time.Hour)) {
		t.Fatalf("wall %v", got)
	}
	if f.Monotonic() != 0 {
		t.Fatalf("monotonic moved with the wall clock: %v", f.Monotonic())
	}
	if next, _ := f.NextDeadline(); !next.Equal(t0.Add(-time.Hour + 10*time.Second)) {
		t.Fatalf("next deadline %v", next)
	}
	f.Advance(9 * time.Second)
	select {
	case <-tm.C():
		t.Fatal("fired early")
	default:
	}
	f.StepWall(2 * time.Hour) // a forward step fires nothing either
	select {
	case <-tm.C():
		t.Fatal("a wall step fired a timer")
	default:
	}
	f.Advance(time.Second)
	<-tm.C()
	if f.Monotonic() != 10*time.Second {
		t.Fatalf("monotonic %v", f.Monotonic())
	}
	f.Set(f.Now().Add(-time.Minute)) // Set never goes back
	if f.Monotonic() != 10*time.Second {
		t.Fatalf("monotonic %v after a Set into the past", f.Monotonic())
	}
}

func TestRealMonotonic(t *testing.T) {
	c := Real()
	a := c.Monotonic()
	time.Sleep(time.Millisecond)
	if b := c.Monotonic(); b-a < time.Millisecond {
		t.Fatalf("monotonic readings %v then %v", a, b)
	}
}
