package main

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ursula/ursula/tests/e2e"
)

// Latency summarises a set of samples in milliseconds.
type Latency struct {
	Count  int     `json:"count"`
	MeanMS float64 `json:"mean_ms"`
	P50MS  float64 `json:"p50_ms"`
	P90MS  float64 `json:"p90_ms"`
	P99MS  float64 `json:"p99_ms"`
	P999MS float64 `json:"p999_ms"`
	MaxMS  float64 `json:"max_ms"`
}

// samples collects durations from many goroutines.
type samples struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *samples) add(d ...time.Duration) {
	s.mu.Lock()
	s.d = append(s.d, d...)
	s.mu.Unlock()
}

func (s *samples) summary() Latency {
	s.mu.Lock()
	d := slices.Clone(s.d)
	s.mu.Unlock()
	return summarize(d)
}

func summarize(d []time.Duration) Latency {
	if len(d) == 0 {
		return Latency{}
	}
	slices.Sort(d)
	var sum time.Duration
	for _, v := range d {
		sum += v
	}
	// Nearest rank.
	q := func(p float64) float64 {
		i := int(math.Ceil(p*float64(len(d)))) - 1
		return ms(d[max(0, min(i, len(d)-1))])
	}
	return Latency{
		Count:  len(d),
		MeanMS: round3(ms(sum) / float64(len(d))),
		P50MS:  q(0.50),
		P90MS:  q(0.90),
		P99MS:  q(0.99),
		P999MS: q(0.999),
		MaxMS:  ms(d[len(d)-1]),
	}
}

func ms(d time.Duration) float64 { return round3(float64(d) / float64(time.Millisecond)) }

func round3(v float64) float64 { return math.Round(v*1000) / 1000 }

// procStatusMiB reads a "Vm…: N kB" field of /proc/<pid>/status in MiB.
func procStatusMiB(pid int, field string) (float64, error) {
	v, err := e2e.ProcStatusBytes(pid, field)
	if err != nil {
		return 0, err
	}
	return round3(float64(v) / (1 << 20)), nil
}

// proc is one process of the server under test (a cluster has several).
type proc struct {
	name string
	pid  int
}

// rssSampler records, every 100 ms, the highest VmRSS of each process and
// the highest sum over the processes.
type rssSampler struct {
	stop  chan struct{}
	done  chan struct{}
	max   float64
	procs []proc
	each  []float64
}

func sampleRSS(procs ...proc) *rssSampler {
	s := &rssSampler{stop: make(chan struct{}), done: make(chan struct{})}
	for _, p := range procs {
		if p.pid > 0 {
			s.procs = append(s.procs, p)
		}
	}
	s.each = make([]float64, len(s.procs))
	go func() {
		defer close(s.done)
		if len(s.procs) == 0 {
			return
		}
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			sum := 0.0
			for i, p := range s.procs {
				if v, err := procStatusMiB(p.pid, "VmRSS"); err == nil {
					sum += v
					s.each[i] = max(s.each[i], v)
				}
			}
			s.max = max(s.max, round3(sum))
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// Stop ends sampling and returns the highest VmRSS (summed over the
// processes) seen in MiB, 0 without a pid.
func (s *rssSampler) Stop() float64 {
	close(s.stop)
	<-s.done
	return s.max
}

// perProcess is the highest VmRSS of each process by name, after Stop.
func (s *rssSampler) perProcess() map[string]float64 {
	out := make(map[string]float64, len(s.procs))
	for i, p := range s.procs {
		out[p.name] = s.each[i]
	}
	return out
}

// cpuTimes reads the CPU time of every process; a process it cannot read
// is an error (its figure would be wrong).
func cpuTimes(procs []proc) ([]time.Duration, error) {
	out := make([]time.Duration, len(procs))
	for i, p := range procs {
		v, err := procCPU(p.pid)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// procCPU is a process's user plus system CPU time from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	if pid <= 0 {
		return 0, errors.New("bench: no pid")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces: fields count from the
	// last ')'. utime and stime are fields 14 and 15.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("bench: malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("bench: short /proc/%d/stat", pid)
	}
	var ticks int64
	for _, s := range f[11:13] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("bench: /proc/%d/stat: %w", pid, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}
