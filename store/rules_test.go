package store

import (
	"errors"
	"slices"
	"testing"
)

func batch(deps map[string][]string, order ...string) ([]*Unit, map[string]int) {
	var units []*Unit
	in := map[string]int{}
	for i, id := range order {
		units = append(units, &Unit{ID: id, DependsOn: deps[id]})
		in[id] = i
	}
	return units, in
}

func TestCheckCycles(t *testing.T) {
	units, in := batch(map[string][]string{"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"outside"}}, "d", "a", "b", "c")
	err := CheckCycles(units, in)
	var ce *CycleError
	if !errors.As(err, &ce) || !errors.Is(err, ErrCycle) {
		t.Fatalf("err %v", err)
	}
	got := slices.Clone(ce.Members)
	slices.Sort(got)
	if !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("members %v", ce.Members)
	}
	units, in = batch(map[string][]string{"b": {"a"}, "c": {"a", "b"}}, "c", "b", "a")
	if err := CheckCycles(units, in); err != nil {
		t.Fatal(err)
	}
}

// TestTopoOrder: every unit comes after the batch units it depends on,
// submission order kept otherwise.
func TestTopoOrder(t *testing.T) {
	units, in := batch(map[string][]string{"child": {"parent"}, "grand": {"child"}}, "grand", "x", "child", "parent")
	var got []string
	for _, i := range TopoOrder(units, in) {
		got = append(got, units[i].ID)
	}
	if !slices.Equal(got, []string{"parent", "child", "grand", "x"}) {
		t.Fatalf("order %v", got)
	}
	units, in = batch(nil, "a", "b")
	if o := TopoOrder(units, in); !slices.Equal(o, []int{0, 1}) {
		t.Fatalf("order %v", o)
	}
}
