package inbox

import (
	"sync"
	"testing"
)

func TestInboxOrderAndWake(t *testing.T) {
	q := New[int]()
	if len(q.Take()) != 0 || q.Len() != 0 {
		t.Fatal("a new inbox is empty")
	}
	q.Push(1, 2)
	q.Push(3)
	select {
	case <-q.Wake():
	default:
		t.Fatal("Push wakes the consumer")
	}
	select {
	case <-q.Wake():
		t.Fatal("pushes before a wake coalesce into one")
	default:
	}
	if q.Len() != 3 {
		t.Fatalf("len %d", q.Len())
	}
	got := q.Take()
	if len(got) != 3 || got[0] != 1 || got[1] != 2 || got[2] != 3 {
		t.Fatalf("take %v", got)
	}
	// The slices are recycled: the next Take returns new items only.
	q.Push(4)
	if got := q.Take(); len(got) != 1 || got[0] != 4 {
		t.Fatalf("take %v", got)
	}
}

// TestInboxConcurrentProducers: every item of many producers arrives once,
// each producer's in its order, and Push never blocks.
func TestInboxConcurrentProducers(t *testing.T) {
	q := New[[2]int]()
	const producers, each = 8, 5000
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := range each {
				q.Push([2]int{p, i})
			}
		})
	}
	next := make([]int, producers)
	total := 0
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for finished := false; !finished || q.Len() > 0; {
		select {
		case <-q.Wake():
		case <-done:
			finished = true
		}
		for _, it := range q.Take() {
			if it[1] != next[it[0]] {
				t.Fatalf("producer %d: got %d, want %d", it[0], it[1], next[it[0]])
			}
			next[it[0]]++
			total++
		}
	}
	if total != producers*each {
		t.Fatalf("%d items, want %d", total, producers*each)
	}
}

// Serve hands every item to f, in batches, in order, and returns once stop
// is closed.
func TestServe(t *testing.T) {
	q := New[int]()
	stop := make(chan struct{})
	got := make(chan int, 10)
	done := make(chan struct{})
	go func() {
		q.Serve(stop, func(batch []int) {
			for _, i := range batch {
				got <- i
			}
		})
		close(done)
	}()
	q.Push(1, 2)
	q.Push(3)
	for want := 1; want <= 3; want++ {
		if i := <-got; i != want {
			t.Fatalf("got %d, want %d", i, want)
		}
	}
	close(stop)
	<-done
}
