// Package heaps provides an indexed binary heap: elements know their
// position, so they can be removed or re-ordered in O(log n).
package heaps

// Heap is a min-heap of T ordered by less. setIdx records each element's
// position (-1 when removed).
type Heap[T any] struct {
	items  []T
	less   func(a, b T) bool
	setIdx func(x T, i int)
}

// New returns an empty heap.
func New[T any](less func(a, b T) bool, setIdx func(x T, i int)) *Heap[T] {
	return &Heap[T]{less: less, setIdx: setIdx}
}

// Len returns the number of elements.
func (h *Heap[T]) Len() int { return len(h.items) }

// Peek returns the least element; the heap must not be empty.
func (h *Heap[T]) Peek() T { return h.items[0] }

// Push adds x.
func (h *Heap[T]) Push(x T) {
	h.items = append(h.items, x)
	h.setIdx(x, len(h.items)-1)
	h.up(len(h.items) - 1)
}

// Pop removes and returns the least element; the heap must not be empty.
func (h *Heap[T]) Pop() T {
	return h.Remove(0)
}

// Remove removes and returns the element at position i.
func (h *Heap[T]) Remove(i int) T {
	n := len(h.items) - 1
	x := h.items[i]
	if i != n {
		h.swap(i, n)
	}
	var zero T
	h.items[n] = zero
	h.items = h.items[:n]
	if i != n {
		if !h.down(i) {
			h.up(i)
		}
	}
	h.setIdx(x, -1)
	return x
}

// Fix restores order after the element at position i changed.
func (h *Heap[T]) Fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

// Items returns the elements in heap order (not sorted). The slice must not
// be modified.
func (h *Heap[T]) Items() []T { return h.items }

func (h *Heap[T]) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.setIdx(h.items[i], i)
	h.setIdx(h.items[j], j)
}

func (h *Heap[T]) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !h.less(h.items[j], h.items[i]) {
			break
		}
		h.swap(i, j)
		j = i
	}
}

func (h *Heap[T]) down(i0 int) bool {
	i, n := i0, len(h.items)
	for {
		j := 2*i + 1
		if j >= n {
			break
		}
		if r := j + 1; r < n && h.less(h.items[r], h.items[j]) {
			j = r
		}
		if !h.less(h.items[j], h.items[i]) {
			break
		}
		h.swap(i, j)
		i = j
	}
	return i > i0
}
