package telemetry

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Kind is how a sample is exported.
type Kind uint8

const (
	// Gauge is a value that goes up and down.
	Gauge Kind = iota
	// Counter is a monotonic count since the process started (exported as
	// an observable counter; Prometheus adds _total).
	Counter
)

// Sample is one value of a metrics snapshot.
type Sample struct {
	// Name is the metric's snake_case name within its source, without a
	// unit suffix or _total (the Prometheus exporter adds them from Unit
	// and Kind).
	Name string
	// Kind says whether Value only grows.
	Kind Kind
	// Unit is the instrument's UCUM unit: "s", "By", or an annotation in
	// braces ("{request}"); empty for a plain number. "s" and "By" become
	// _seconds and _bytes in Prometheus; annotations are not shown there.
	Unit string
	// Help describes the metric (the instrument's description, the HELP
	// line in Prometheus). A sample without one is not exported.
	Help string
	// Value is the current value (a running total for a Counter).
	Value float64
	// Attrs identify the series (raft_group_id, for example); nil for a
	// process-wide value.
	Attrs []attribute.KeyValue
}

// Source emits one snapshot of a component's metrics, one sample per
// series. It is called on every collection (a Prometheus scrape, an OTLP
// export) and must be safe for concurrent use; it reads the counters the
// component keeps anyway, so nothing is counted twice.
type Source func(emit func(Sample))

// RegisterSource exports src's samples as instruments named
// "ursula.<name>.<sample name>". The SDK cannot create instruments while it
// collects, so instruments are created outside collections: for the names
// src emits when RegisterSource runs, before each Prometheus scrape, and
// after each OTLP export for names that export met first (they are
// exported from the next one on).
func (t *Telemetry) RegisterSource(name string, src Source) error {
	if t.mp == nil {
		return nil
	}
	b := &bridge{meter: t.mp.Meter(ScopePrefix + name), prefix: "ursula." + name + ".", src: src, insts: map[instKey]metric.Float64Observable{}}
	if err := b.sync(); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.shutdown {
		return b.close()
	}
	t.bridges = append(t.bridges, b)
	return nil
}

// syncSources registers the instruments of sample names first seen by a
// collection or, with all, of every name the sources emit now (a snapshot
// each).
func (t *Telemetry) syncSources(all bool) {
	t.mu.Lock()
	bridges := t.bridges
	t.mu.Unlock()
	for _, b := range bridges {
		if all || b.stale.Load() {
			if err := b.sync(); err != nil {
				t.logger.Warn("metric source sync failed", "source", b.prefix, "err", err)
			}
		}
	}
}

type instKey struct {
	name string
	kind Kind
}

// bridge observes one source through one callback.
type bridge struct {
	meter  metric.Meter
	prefix string
	src    Source
	// stale is set by a collection that met a sample without an instrument.
	stale atomic.Bool

	mu    sync.Mutex
	insts map[instKey]metric.Float64Observable
	reg   metric.Registration
}

// sync creates the instruments of every sample name src emits now and, if
// there are new ones, replaces the callback with one that observes them
// all. The callback reads an immutable copy of the instrument map, so it
// takes no lock of ours while the SDK holds its own.
func (b *bridge) sync() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stale.Store(false)
	added := false
	var errs []error
	b.src(func(s Sample) {
		k := instKey{s.Name, s.Kind}
		if _, ok := b.insts[k]; ok || s.Help == "" {
			return
		}
		var (
			inst metric.Float64Observable
			err  error
		)
		if s.Kind == Counter {
			inst, err = b.meter.Float64ObservableCounter(b.prefix+s.Name, metric.WithDescription(s.Help), metric.WithUnit(s.Unit))
		} else {
			inst, err = b.meter.Float64ObservableGauge(b.prefix+s.Name, metric.WithDescription(s.Help), metric.WithUnit(s.Unit))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("instrument %s: %w", b.prefix+s.Name, err))
			return
		}
		b.insts[k] = inst
		added = true
	})
	if !added && b.reg != nil {
		return errors.Join(errs...)
	}
	insts := maps.Clone(b.insts)
	list := make([]metric.Observable, 0, len(insts))
	for _, inst := range insts {
		list = append(list, inst)
	}
	if len(list) == 0 {
		// Nothing to observe yet: look again at the next collection.
		b.stale.Store(true)
		return errors.Join(errs...)
	}
	if b.reg != nil {
		if err := b.reg.Unregister(); err != nil {
			errs = append(errs, err)
		}
		b.reg = nil
	}
	reg, err := b.meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		b.src(func(s Sample) {
			inst, ok := insts[instKey{s.Name, s.Kind}]
			if !ok {
				if s.Help != "" {
					b.stale.Store(true)
				}
				return
			}
			if len(s.Attrs) == 0 {
				o.ObserveFloat64(inst, s.Value)
				return
			}
			o.ObserveFloat64(inst, s.Value, metric.WithAttributes(s.Attrs...))
		})
		return nil
	}, list...)
	if err != nil {
		errs = append(errs, fmt.Errorf("register callback: %w", err))
	} else {
		b.reg = reg
	}
	return errors.Join(errs...)
}

func (b *bridge) close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.reg == nil {
		return nil
	}
	err := b.reg.Unregister()
	b.reg = nil
	return err
}

// Document reads a JSON-shaped metrics document (the map a component
// serves as JSON: float64 and bool values, nested objects, lists of
// objects) as samples. Only the values Metrics describes are exported:
// the JSON document is an operator contract whose keys do not follow the
// Prometheus conventions, so Metrics gives each exported value its
// conventional name, kind, unit and description.
type Document struct {
	// Lists says how to read a key holding a list of objects: each element
	// becomes a series of its own. Other lists and strings are skipped.
	Lists map[string]List
	// Metrics describes the exported values, by flattened document name
	// (see Emit); values not in it are not exported.
	Metrics map[string]Metric
}

// Metric describes how a document value is exported.
type Metric struct {
	// Name is the sample name; empty means the flattened document name.
	Name string
	// Kind, Unit and Help are the sample's (see Sample).
	Kind Kind
	Unit string
	Help string
	// Scale multiplies the value into Unit (1e-9 for a count of
	// nanoseconds exported in seconds); 0 means 1.
	Scale float64
	// Omit keeps the value out of the export on purpose (an identity, a
	// duplicate of another value); it stays in the JSON document.
	Omit bool
}

// List describes a list of objects in a Document.
type List struct {
	// Prefix prefixes the names of the elements' values ("raft_group_").
	Prefix string
	// IDKey is the element key that identifies the element
	// ("raft_group_id"); it becomes an attribute, not a sample.
	IDKey string
	// Attr names that attribute; empty means IDKey.
	Attr string
}

// Undescribed returns the flattened names of doc's numeric values that
// Metrics neither describes nor omits, sorted: a test over a real document
// proves with it that every value has a conventional export.
func (d Document) Undescribed(doc map[string]any) []string {
	seen := map[string]bool{}
	d.walk(doc, func(name string, _ float64, _ []attribute.KeyValue) {
		if _, ok := d.Metrics[name]; !ok {
			seen[name] = true
		}
	})
	return slices.Sorted(maps.Keys(seen))
}

// Emit emits doc's numeric values: top-level values under their key,
// nested objects' values as "<key>_<nested key>", booleans as 0 or 1, and
// each element of a described list with its id attribute.
// Values Metrics does not describe, or omits, are skipped.
func (d Document) Emit(doc map[string]any, emit func(Sample)) {
	d.walk(doc, func(name string, v float64, attrs []attribute.KeyValue) {
		m, ok := d.Metrics[name]
		if !ok || m.Omit {
			return
		}
		if m.Name != "" {
			name = m.Name
		}
		if m.Scale != 0 {
			v *= m.Scale
		}
		emit(Sample{Name: name, Kind: m.Kind, Unit: m.Unit, Help: m.Help, Value: v, Attrs: attrs})
	})
}

// walk calls f for every numeric value of doc, by flattened name.
func (d Document) walk(doc map[string]any, f func(name string, v float64, attrs []attribute.KeyValue)) {
	for k, v := range doc {
		if l, ok := d.Lists[k]; ok {
			if elems, ok := v.([]any); ok {
				d.walkList(l, elems, f)
			}
			continue
		}
		walkValue(k, v, nil, f)
	}
}

func (d Document) walkList(l List, elems []any, f func(string, float64, []attribute.KeyValue)) {
	attr := l.Attr
	if attr == "" {
		attr = l.IDKey
	}
	for _, e := range elems {
		obj, ok := e.(map[string]any)
		if !ok {
			continue
		}
		id, ok := idString(obj[l.IDKey])
		if !ok {
			continue
		}
		attrs := []attribute.KeyValue{attribute.String(attr, id)}
		for k, v := range obj {
			if k != l.IDKey {
				walkValue(l.Prefix+k, v, attrs, f)
			}
		}
	}
}

func walkValue(name string, v any, attrs []attribute.KeyValue, f func(string, float64, []attribute.KeyValue)) {
	var fv float64
	switch x := v.(type) {
	case float64:
		fv = x
	case float32:
		fv = float64(x)
	case int:
		fv = float64(x)
	case int64:
		fv = float64(x)
	case uint64:
		fv = float64(x)
	case bool:
		if x {
			fv = 1
		}
	case map[string]any:
		for k, nv := range x {
			walkValue(name+"_"+snakeCase(k), nv, attrs, f)
		}
		return
	default:
		return
	}
	if math.IsNaN(fv) {
		return
	}
	f(name, fv, attrs)
}

// idString renders a list element's id (a JSON number or string).
func idString(v any) (string, bool) {
	switch x := v.(type) {
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return strconv.FormatInt(int64(x), 10), true
		}
		return strconv.FormatFloat(x, 'g', -1, 64), true
	case int:
		return strconv.Itoa(x), true
	case uint64:
		return strconv.FormatUint(x, 10), true
	case string:
		return x, x != ""
	}
	return "", false
}

// snakeCase turns a Go field name that reached a document without a JSON
// tag ("BytesWritten") into the documents' key style ("bytes_written").
func snakeCase(k string) string {
	if strings.IndexFunc(k, unicode.IsUpper) < 0 {
		return k
	}
	var b strings.Builder
	for i, r := range k {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}
