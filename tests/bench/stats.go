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

// rssSampler records the highest VmRSS of a process, sampled every 100 ms.
type rssSampler struct {
	stop chan struct{}
	done chan struct{}
	max  float64
}

func sampleRSS(pid int) *rssSampler {
	s := &rssSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		if pid <= 0 {
			return
		}
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if v, err := procStatusMiB(pid, "VmRSS"); err == nil && v > s.max {
				s.max = v
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// Stop ends sampling and returns the highest VmRSS seen in MiB (0 without a
// pid).
func (s *rssSampler) Stop() float64 {
	close(s.stop)
	<-s.done
	return s.max
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
