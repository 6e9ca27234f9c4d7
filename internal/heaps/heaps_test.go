package heaps

import (
	"math/rand/v2"
	"slices"
	"testing"
)

type item struct {
	v   int
	idx int
}

func newHeap() *Heap[*item] {
	return New(func(a, b *item) bool { return a.v < b.v }, func(x *item, i int) { x.idx = i })
}

// TestHeapProperty: random pushes, pops, removals and fixes keep the heap
// ordered and every element's index right; removed elements get -1.
func TestHeapProperty(t *testing.T) {
	rnd := rand.New(rand.NewPCG(3, 3))
	h := newHeap()
	var live []*item
	check := func() {
		for i, x := range h.Items() {
			if x.idx != i {
				t.Fatalf("element at %d thinks it is at %d", i, x.idx)
			}
			if i > 0 && h.Items()[(i-1)/2].v > x.v {
				t.Fatalf("heap order broken at %d", i)
			}
		}
		if h.Len() != len(live) {
			t.Fatalf("len %d, want %d", h.Len(), len(live))
		}
	}
	for range 20000 {
		switch op := rnd.IntN(10); {
		case op < 4 || len(live) == 0:
			x := &item{v: rnd.IntN(1000)}
			h.Push(x)
			live = append(live, x)
		case op < 6:
			min := slices.MinFunc(live, func(a, b *item) int { return a.v - b.v }).v
			x := h.Pop()
			if x.v != min {
				t.Fatalf("pop %d, want the least %d", x.v, min)
			}
			if x.idx != -1 {
				t.Fatal("a popped element's index is -1")
			}
			live = slices.DeleteFunc(live, func(y *item) bool { return y == x })
		case op < 8:
			x := live[rnd.IntN(len(live))]
			if got := h.Remove(x.idx); got != x || x.idx != -1 {
				t.Fatal("Remove returns the element and marks it -1")
			}
			live = slices.DeleteFunc(live, func(y *item) bool { return y == x })
		default:
			x := live[rnd.IntN(len(live))]
			x.v = rnd.IntN(1000)
			h.Fix(x.idx)
		}
		check()
	}
	// Drained in order.
	prev := -1
	for h.Len() > 0 {
		x := h.Pop()
		if x.v < prev {
			t.Fatalf("drained %d after %d", x.v, prev)
		}
		prev = x.v
	}
}
