// Package inbox is a multi-producer, single-consumer queue whose Push never
// blocks. runcue's writer and dispatcher goroutines feed each other through
// inboxes, so neither can ever wait on the other.
package inbox

import "sync"

// Inbox is an unbounded FIFO queue. Push may be called from any goroutine;
// Take from one consumer at a time.
type Inbox[T any] struct {
	mu    sync.Mutex
	items []T
	spare []T
	wake  chan struct{}
}

// New returns an empty Inbox.
func New[T any]() *Inbox[T] {
	return &Inbox[T]{wake: make(chan struct{}, 1)}
}

// Push appends items and wakes the consumer.
func (q *Inbox[T]) Push(items ...T) {
	q.mu.Lock()
	q.items = append(q.items, items...)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// Wake returns a channel that receives after a Push. A receive does not
// guarantee that items are waiting (another Take may have taken them).
func (q *Inbox[T]) Wake() <-chan struct{} { return q.wake }

// Take returns every waiting item, oldest first. The slice is valid until
// the next call to Take.
func (q *Inbox[T]) Take() []T {
	q.mu.Lock()
	items := q.items
	clear(q.spare)
	q.items = q.spare[:0]
	q.spare = items
	q.mu.Unlock()
	return items
}

// Len returns the number of waiting items.
func (q *Inbox[T]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

// Serve is a consumer loop: it calls f with every batch of waiting items,
// oldest first, until stop is closed. Items waiting when stop closes are
// left. The batch is valid until f returns.
func (q *Inbox[T]) Serve(stop <-chan struct{}, f func(batch []T)) {
	for {
		select {
		case <-q.wake:
		case <-stop:
			return
		}
		if items := q.Take(); len(items) > 0 {
			f(items)
		}
	}
}
