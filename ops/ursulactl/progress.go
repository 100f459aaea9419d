package ursulactl

import (
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress shows a long wait on a terminal: a bar of done out of total
// with a description, or a spinner with a description when the wait has no
// count. Without a terminal it shows nothing; the operations print their
// results as lines either way.
type progress struct {
	bar     *progressbar.ProgressBar
	total   int
	spinner bool
}

// newProgress starts a progress bar on Out when Options.TTY is set; a
// spinner when counted is false.
func (c *Controller) newProgress(desc string, counted bool) *progress {
	if !c.opts.TTY {
		return &progress{}
	}
	opts := []progressbar.Option{
		progressbar.OptionSetWriter(c.out),
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
