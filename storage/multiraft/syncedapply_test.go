package multiraft

import (
	"context"
	"encoding/binary"
	"sync/atomic"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/ursula/ursula/storage/wal/powerloss"
	"github.com/ursula/ursula/tests/await"
)

// TestFsyncAlwaysAppliesOnlySynced: under fsync "always" a replica
// applies an entry (and its leader answers the proposal) only once the
// entry is synced in its journal. The power goes out at the very moment the
// entry is applied; after the restart the replica's log must hold it.
// The catching-up follower gets its missing entries and a commit index
// covering them in one message: one Ready both appends and commits them.
func TestFsyncAlwaysAppliesOnlySynced(t *testing.T) {
	for _, role := range []string{"leader", "catching-up follower"} {
		t.Run(role, func(t *testing.T) {
			disks := map[uint64]*powerloss.FS{}
			c := newCluster(t, 3, func(cfg *Config) {
				cfg.GroupCount, cfg.ShardCount = 1, 1
				cfg.Fsync = FsyncAlways
				disks[cfg.NodeID] = powerloss.New(cfg.Dir)
				cfg.FS = disks[cfg.NodeID]
			})
			c.proposeN(t, 0, 3)
			c.converged(t, 0)
			leader := c.leader(t, 0)
			victim := leader.h.cfg.NodeID
			if role != "leader" {
				victim = victim%3 + 1
				c.net.setHold(func(_ uint32, m *pb.Message) bool {
					return m.GetTo() == victim && m.GetType() == pb.MsgApp
				})
			}
			const marker = 100
			var applied atomic.Uint64 // the marker's index where the power went out
			n := c.nodes[victim]
			n.sms[0].setProbe(func(index uint64, data []byte) {
				if binary.LittleEndian.Uint64(data) != marker || applied.Load() != 0 {
					return
				}
				applied.Store(index)
				if _, err := disks[victim].PowerLoss(powerloss.Loss{}); err != nil {
					t.Errorf("PowerLoss: %v", err)
				}
			})
			if role == "leader" {
				// Answered or not, the power goes out while it applies.
				_, _ = leader.h.Propose(context.Background(), 0, u64(marker))
			} else {
				for i := range 5 {
					if _, err := leader.h.Propose(context.Background(), 0, u64(uint64(marker+i))); err != nil {
						t.Fatalf("Propose: %v", err)
					}
				}
				// The leader's appends to the victim were lost: the
				// victim refuses the next one, and the leader sends
				// everything it missed with a commit index covering it.
				c.net.discard()
			}
			await.True(t, "the marker to be applied", func() bool { return applied.Load() != 0 })
			n.powerLost = true
			n.cancel()
			<-n.done // fails if it wrote since: the disk is gone
			c.net.set(victim, nil)
			c.net.setDown(victim, true) // what it holds, not what it would catch up
			delete(c.nodes, victim)
			cfg := c.cfgs[victim]
			cfg.FS = powerloss.New(cfg.Dir)
			c.cfgs[victim] = cfg
			restarted := c.start(t, victim)
			if st := restarted.h.Status(0); st.LastIndex < applied.Load() {
				t.Fatalf("entry %d was applied before it was synced: after the power loss the log ends at %d", applied.Load(), st.LastIndex)
			}
		})
	}
}
