package stream

import (
	"sort"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

// producerSet is a stream's producer table, by producer id. Most streams
// have one producer or none, and a map of one entry costs about 250 bytes
// (its header and a group of eight slots): a quarter of a GB at a million
// streams. The set holds a lone producer in a field and makes the map at
// the second.
type producerSet struct {
	one  *storagev1.ProducerState            // the only producer (many is nil)
	many map[string]*storagev1.ProducerState // two or more producers
}

func (p *producerSet) len() int {
	if p.one != nil {
		return 1
	}
	return len(p.many)
}

// get returns the producer named id, or nil.
func (p *producerSet) get(id string) *storagev1.ProducerState {
	if p.one != nil {
		if p.one.GetId() == id {
			return p.one
		}
		return nil
	}
	return p.many[id]
}

// put stores ps, replacing the producer of its id.
func (p *producerSet) put(ps *storagev1.ProducerState) {
	switch {
	case p.many != nil:
		p.many[ps.GetId()] = ps
	case p.one == nil || p.one.GetId() == ps.GetId():
		p.one = ps
	default:
		p.many = map[string]*storagev1.ProducerState{p.one.GetId(): p.one, ps.GetId(): ps}
		p.one = nil
	}
}

// remove drops the producer named id, if any.
func (p *producerSet) remove(id string) {
	if p.one != nil {
		if p.one.GetId() == id {
			p.one = nil
		}
		return
	}
	delete(p.many, id)
	if len(p.many) == 1 {
		for _, ps := range p.many {
			p.one = ps
		}
		p.many = nil
	}
}

// each calls fn for every producer, in no particular order.
func (p *producerSet) each(fn func(*storagev1.ProducerState)) {
	if p.one != nil {
		fn(p.one)
		return
	}
	for _, ps := range p.many {
		fn(ps)
	}
}

// inOrder calls fn for every producer in the order of their ids (a
// snapshot's order), stopping at its first error.
func (p *producerSet) inOrder(fn func(*storagev1.ProducerState) error) error {
	if p.one != nil {
		return fn(p.one)
	}
	ids := make([]string, 0, len(p.many))
	for id := range p.many {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if err := fn(p.many[id]); err != nil {
			return err
		}
	}
	return nil
}
