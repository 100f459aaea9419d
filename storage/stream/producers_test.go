package stream

import (
	"fmt"
	"slices"
	"testing"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

// The set answers like a map through one producer, many, and back to one.
func TestProducerSet(t *testing.T) {
	var set producerSet
	want := map[string]*storagev1.ProducerState{}
	check := func(step string) {
		t.Helper()
		if set.len() != len(want) {
			t.Fatalf("%s: len %d, want %d", step, set.len(), len(want))
		}
		for id, ps := range want {
			if set.get(id) != ps {
				t.Fatalf("%s: get(%q) = %v, want %v", step, id, set.get(id), ps)
			}
		}
		if set.get("absent") != nil {
			t.Fatalf("%s: an absent producer found", step)
		}
		var order []string
		if err := set.inOrder(func(p *storagev1.ProducerState) error { order = append(order, p.GetId()); return nil }); err != nil {
			t.Fatal(err)
		}
		if !slices.IsSorted(order) || len(order) != len(want) {
			t.Fatalf("%s: inOrder visited %v", step, order)
		}
		n := 0
		set.each(func(*storagev1.ProducerState) { n++ })
		if n != len(want) {
			t.Fatalf("%s: each visited %d producers, want %d", step, n, len(want))
		}
	}
	put := func(id string, seq uint64) {
		ps := &storagev1.ProducerState{Id: id, Seq: seq}
		set.put(ps)
		want[id] = ps
	}
	remove := func(id string) {
		set.remove(id)
		delete(want, id)
	}
	check("empty")
	put("b", 1)
	check("one")
	put("b", 2)
	check("one replaced")
	put("a", 1)
	check("two")
	for i := range 10 {
		put(fmt.Sprintf("p%d", i), uint64(i))
	}
	check("twelve")
	remove("absent")
	for i := range 10 {
		remove(fmt.Sprintf("p%d", i))
	}
	check("back to two")
	remove("b")
	check("back to one")
	if set.many != nil {
		t.Fatal("one producer left in a map")
	}
	remove("a")
	check("none")
}
