package engine

import (
	"bytes"
	"context"
	"strconv"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
)

// JSON record coordinates: the engine resolves records to positions (and
// back) through the state machine, which knows the ordinals at the hot
// window's start and at every cold-index entry, and scans one hot range or
// one cold object for the rest. Nothing is kept per message.

// hasRecordStart reports whether a read starts at a record coordinate.
func hasRecordStart(req *streamv1.ReadRequest) bool {
	return req.Record != nil || req.GetRecordNow() || req.GetTailRecords() > 0
}

// recordStart resolves a read's record coordinate to a position.
func (e *Engine) recordStart(ctx context.Context, req *streamv1.ReadRequest, m stream.Meta, leader bool) (uint64, error) {
	if !m.JSON {
		return 0, fault.Errorf(fault.ErrInvalidArgument, "record coordinates need an application/json stream")
	}
	n := m.RecordNext
	switch {
	case req.Record != nil:
		n = req.GetRecord()
	case req.GetTailRecords() > 0:
		n = m.RecordNext - min(req.GetTailRecords(), m.RecordNext-m.RecordFirst)
	}
	if n < m.RecordFirst {
		return 0, recordTrimmed(m, n)
	}
	if n > m.RecordNext {
		if !leader {
			return 0, e.notLeader(m.Key)
		}
		return 0, fault.Errorf(fault.ErrOffsetOutOfRange, "record %d is beyond the record tail %d", n, m.RecordNext).
			With(fault.DetailRecordNext, uintString(m.RecordNext))
	}
	return e.recordPos(ctx, m, n)
}

// recordTrimmed answers a record coordinate below the stream's first
// retained record.
func recordTrimmed(m stream.Meta, n uint64) error {
	return fault.Errorf(fault.ErrOffsetTrimmed, "record %d is below the stream's first retained record %d", n, m.RecordFirst).
		With(fault.DetailNextOffset, stream.FormatOffset(m.Retained)).
		With(fault.DetailRecordNext, uintString(m.RecordNext))
}

// recordPos returns the position where JSON record n of m's view starts,
// following the fork chain for records m inherited.
func (e *Engine) recordPos(ctx context.Context, m stream.Meta, n uint64) (uint64, error) {
	for depth := 0; depth < 1024; depth++ {
		if n >= m.BaseRecord {
			pos, ref, ok := e.machine(m.Key).RecordPos(m.Key, m.Incarnation, n)
			if !ok {
				return 0, fault.Errorf(fault.ErrOffsetOutOfRange, "record %d of stream %s is not held here", n, m.Key.Stream)
			}
			if ref == nil {
				return pos, nil
			}
			return e.cold.RecordPos(ctx, m, ref, n)
		}
		src, err := e.forkSource(m)
		if err != nil {
			return 0, err
		}
		m = src
	}
	return 0, fault.Errorf(fault.ErrInternal, "fork chain too deep")
}

// recordAt returns the JSON record ordinal at a message boundary pos of
// m's view (the number of messages before it).
func (e *Engine) recordAt(ctx context.Context, m stream.Meta, pos uint64) (uint64, error) {
	for depth := 0; depth < 1024; depth++ {
		if pos >= m.Base {
			rec, ref, ok := e.machine(m.Key).RecordAt(m.Key, m.Incarnation, pos)
			if !ok {
				return 0, fault.Errorf(fault.ErrOffsetOutOfRange, "position %d of stream %s is not held here", pos, m.Key.Stream)
			}
			if ref == nil {
				return rec, nil
			}
			return e.cold.RecordAt(ctx, m, ref, pos)
		}
		src, err := e.forkSource(m)
		if err != nil {
			return 0, err
		}
		m = src
	}
	return 0, fault.Errorf(fault.ErrInternal, "fork chain too deep")
}

// forkSource is the local replica of m's fork source.
func (e *Engine) forkSource(m stream.Meta) (stream.Meta, error) {
	f := m.Fork
	if f == nil {
		return m, fault.Errorf(fault.ErrInternal, "stream %s starts at %d but has no fork origin", m.Key.Stream, m.Base)
	}
	sk := stream.Key{Bucket: f.GetSourceBucket(), Stream: f.GetSourceStream()}
	src, ok := e.machine(sk).Lookup(sk)
	if ok && src.LostHistory(f.GetSourceIncarnation(), m.Base) {
		return m, lostForkHistory(m, src)
	}
	if !ok || !src.HoldsHistory(f.GetSourceIncarnation(), m.Base) {
		return m, fault.Errorf(fault.ErrUnavailable, "fork source %s of %s is not replicated here", sk.Stream, m.Key.Stream).With(fault.DetailRetryAfterMS, "200")
	}
	return src, nil
}

// lostForkHistory answers a read of fork m below its base when its source
// src started a new history without the bytes m inherited: waiting does
// not bring them back.
func lostForkHistory(m, src stream.Meta) error {
	return fault.Errorf(fault.ErrForkSourceGone, "fork source %s of %s started a new history that does not hold the bytes below the fork's offset %s",
		src.Key.Stream, m.Key.Stream, stream.FormatOffset(m.Base))
}

// withRecords adds the JSON record range of a read's data, first cutting
// it after maxRecords messages (0: no bound).
func (e *Engine) withRecords(ctx context.Context, m stream.Meta, resp *streamv1.ReadResponse, pos, maxRecords uint64) error {
	if !m.JSON {
		return nil
	}
	first, err := e.recordAt(ctx, m, pos)
	if err != nil {
		return err
	}
	data := resp.GetData()
	if maxRecords > 0 {
		if cut := nthLineEnd(data, maxRecords); cut < len(data) {
			data = data[:cut]
			resp.Data = data
			resp.NextOffset = stream.FormatOffset(pos + uint64(cut))
			resp.UpToDate, resp.Closed = false, false
		}
	}
	resp.RecordFirst = first
	resp.RecordNext = first + uint64(bytes.Count(data, []byte{'\n'}))
	return nil
}

// nthLineEnd is the length of the first n lines of data (all of it when it
// holds fewer).
func nthLineEnd(data []byte, n uint64) int {
	p := 0
	for k := uint64(0); k < n; k++ {
		j := bytes.IndexByte(data[p:], '\n')
		if j < 0 {
			return len(data)
		}
		p += j + 1
	}
	return p
}

func uintString(v uint64) string { return strconv.FormatUint(v, 10) }

// frameRecords is the number of records an external JSON payload holds.
func frameRecords(stored []byte) uint64 { return uint64(bytes.Count(stored, []byte{'\n'})) }
