package transport

import (
	"context"
	"errors"
	"fmt"
	"io"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
)

// sendSnapshot sends MsgSnap m to p on its own goroutine and reports the
// outcome with ReportSnapshot.
func (t *Transport) sendSnapshot(group uint32, p *peer, m *pb.Message) {
	t.mu.Lock()
	if t.closed || int(p.snaps.Load()) >= t.cfg.MaxSnapshotsPerPeer {
		closed := t.closed
		t.mu.Unlock()
		t.stats.snapshotsFailed.Add(1)
		if !closed {
			p.logger.Warn("too many snapshot sends in flight to peer; reporting this one failed", "group_id", group)
		}
		t.reportUnreachable(group, p.id)
		t.reportSnapshot(group, p.id, true)
		return
	}
	p.snaps.Add(1)
	t.wg.Add(1)
	t.mu.Unlock()
	go func() {
		defer t.wg.Done()
		defer p.snaps.Add(-1)
		err := t.streamSnapshot(t.life, group, p, m)
		if err != nil {
			t.stats.snapshotsFailed.Add(1)
			if t.life.Err() == nil {
				p.logger.Warn("cannot send raft snapshot", "group_id", group,
					"index", m.GetSnapshot().GetMetadata().GetIndex(), "err", err)
			}
			t.reportUnreachable(group, p.id)
			t.reportSnapshot(group, p.id, true)
			return
		}
		t.stats.snapshotsSent.Add(1)
		t.reportSnapshot(group, p.id, false)
	}()
}

// streamSnapshot sends m as SnapshotChunks: the first carries m without its
// snapshot data, every chunk a slice of the data, the last one Last.
func (t *Transport) streamSnapshot(ctx context.Context, group uint32, p *peer, m *pb.Message) error {
	cc, err := t.conn(p)
	if err != nil {
		return err
	}
	head, err := proto.Marshal(withoutSnapshotData(m))
	if err != nil {
		return fmt.Errorf("transport: encode snapshot message: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := raftv1.NewRaftServiceClient(cc).SendSnapshot(ctx)
	if err != nil {
		return fmt.Errorf("transport: open snapshot stream to node %d: %w", p.id, t.outboundError(p, err))
	}
	data := m.GetSnapshot().GetData()
	chunk := t.cfg.SnapshotChunkBytes
	for off := 0; ; off += chunk {
		end := min(off+chunk, len(data))
		c := &raftv1.SnapshotChunk{GroupId: group, Data: data[off:end], Last: end == len(data)}
		if off == 0 {
			c.Message = head
		}
		if err := stream.Send(c); err != nil {
			if errors.Is(err, io.EOF) {
				_, err = stream.CloseAndRecv()
			}
			return fmt.Errorf("transport: send snapshot chunk to node %d: %w", p.id, t.outboundError(p, err))
		}
		t.stats.snapshotBytesSent.Add(uint64(end - off))
		if c.Last {
			break
		}
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		return fmt.Errorf("transport: finish snapshot to node %d: %w", p.id, t.outboundError(p, err))
	}
	return nil
}

// withoutSnapshotData returns a shallow copy of m whose snapshot keeps its
// metadata but not its data; m itself is not modified.
func withoutSnapshotData(m *pb.Message) *pb.Message {
	h := &pb.Message{}
	hr := h.ProtoReflect()
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Name() != "snapshot" {
			hr.Set(fd, v)
		}
		return true
	})
	if s := m.GetSnapshot(); s != nil {
		h.Snapshot = &pb.Snapshot{Metadata: s.GetMetadata()}
	}
	return h
}
