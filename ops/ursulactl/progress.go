package ursulactl

import (
	"fmt"
	"io"
	"time"

	"github.com/schollz/progressbar/v3"
)

// Pacing of progress lines when stderr is not a terminal.
const (
	// progressLineGap is the least time between two progress lines: a
	// change within it is printed with the next observation after it.
	progressLineGap = 2 * time.Second
	// progressHeartbeat repeats an unchanged state, so that a log shows
	// the wait is alive.
	progressHeartbeat = 15 * time.Second
)

// progress shows a long wait on Options.Progress (stderr): on a terminal,
// a bar of done out of total with a description, or a spinner with a
// description when the wait has no count; otherwise plain lines (see
// lineProgress). Without Options.Progress (--quiet) it shows nothing.
// The operations print their results as lines on Out either way.
type progress struct {
	bar     *progressbar.ProgressBar
	total   int
	spinner bool
	lines   *lineProgress
}

// newProgress starts a progress bar on a terminal, a spinner when counted
// is false; plain lines elsewhere.
func (c *Controller) newProgress(desc string, counted bool) *progress {
	if c.opts.Progress == nil {
		return &progress{}
	}
	if !c.opts.TTY {
		return &progress{lines: &lineProgress{w: c.opts.Progress, now: c.now}, spinner: !counted}
	}
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(c.opts.Progress),
		progressbar.OptionSetDescription(desc),
		progressbar.OptionSetWidth(24),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetPredictTime(false),
		progressbar.OptionThrottle(100 * time.Millisecond),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionSetRenderBlankState(true),
		// The spinner turns on each observation: no ticker goroutine.
		progressbar.OptionSetSpinnerChangeInterval(0),
	}
	max := -1
	if counted {
		max = 1
		opts = append(opts, progressbar.OptionShowCount())
	}
	bar := progressbar.NewOptions(max, opts...)
	return &progress{bar: bar, total: 1, spinner: !counted}
}

// set shows done out of total (ignored by a spinner) and the description.
func (p *progress) set(done, total int, desc string) {
	if p.lines != nil {
		if total > 0 && !p.spinner {
			desc = fmt.Sprintf("%s [%d/%d]", desc, done, total)
		}
		p.lines.set(desc)
		return
	}
	if p.bar == nil {
		return
	}
	p.bar.Describe(desc)
	if p.spinner {
		_ = p.bar.Add(1)
		return
	}
	total = max(total, 1)
	if total != p.total {
		p.bar.ChangeMax(total)
		p.total = total
	}
	_ = p.bar.Set(min(done, total-1)) // the bar ends in finish, not at total
}

// clear erases the bar before a result line; the next set draws it again.
func (p *progress) clear() {
	if p.bar != nil {
		_ = p.bar.Clear()
	}
}

// finish removes the bar so that the result line starts on a clean line.
func (p *progress) finish() {
	if p.bar == nil {
		return
	}
	_ = p.bar.Clear()
	_ = p.bar.Exit()
}

// lineProgress prints a wait's state as plain lines: the first state at
// once, a changed state when progressLineGap passed since the last line
// (changes in between are folded into the next line), and an unchanged
// one again every progressHeartbeat. So a wait of any length prints a
// bounded number of lines per minute.
type lineProgress struct {
	w      io.Writer
	now    func() time.Time
	last   string
	lastAt time.Time
	any    bool
}

func (l *lineProgress) set(state string) {
	now := l.now()
	since := now.Sub(l.lastAt)
	switch {
	case !l.any:
	case state != l.last && since >= progressLineGap:
	case since >= progressHeartbeat:
	default:
		return
	}
	l.any, l.last, l.lastAt = true, state, now
	fmt.Fprintf(l.w, "ursulactl: %s\n", state)
}
