package ulid

import (
	"sort"
	"sync"
	"testing"
	"time"
)

func TestOrderedAndUnique(t *testing.T) {
	var g Generator
	base := time.UnixMilli(1_700_000_000_000)
	var ids []string
	for i := range 5000 {
		// Time standing still, moving forward and going backwards.
		ts := base.Add(time.Duration(i/100) * time.Millisecond)
		if i%7 == 0 {
			ts = base
		}
		ids = append(ids, g.New(ts))
	}
	if !sort.StringsAreSorted(ids) {
		t.Fatal("identifiers are not in the order they were made")
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if len(id) != 26 {
			t.Fatalf("length %d: %q", len(id), id)
		}
		if seen[id] {
			t.Fatalf("duplicate %q", id)
		}
		seen[id] = true
	}
}

func TestTimePrefixSorts(t *testing.T) {
	var g1, g2 Generator
	a := g1.New(time.UnixMilli(1000))
	b := g2.New(time.UnixMilli(1001))
	if !(a < b) {
		t.Fatalf("%q should sort before %q", a, b)
	}
}

func TestConcurrent(t *testing.T) {
	var g Generator
	var mu sync.Mutex
	seen := map[string]bool{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				id := g.New(time.Now())
				mu.Lock()
				if seen[id] {
					t.Errorf("duplicate %q", id)
				}
				seen[id] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}
