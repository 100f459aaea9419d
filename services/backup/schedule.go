package backup

import (
	"errors"
	"fmt"
	"time"

	"github.com/robfig/cron/v3"
)

// Schedule says when the service backs up.
type Schedule interface {
	// Next is the first run after t.
	Next(t time.Time) time.Time
	// First is the first run of a process that starts at now when the
	// location's newest complete backup was created at last (zero: none).
	First(now, last time.Time) time.Time
	String() string
}

// ParseSchedule builds the schedule of exactly one of interval (every
// interval) or expr, a cron expression: five fields (minute hour
// day-of-month month day-of-week), a descriptor (@daily, @hourly,
// @every 6h), optionally preceded by CRON_TZ=<zone>; times are UTC unless
// it names a zone.
func ParseSchedule(interval time.Duration, expr string) (Schedule, error) {
	switch {
	case interval != 0 && expr != "":
		return nil, errors.New("backup: set either interval or cron, not both")
	case expr != "":
		s, err := cron.ParseStandard(expr)
		if err != nil {
			return nil, fmt.Errorf("backup: cron %q: %w", expr, err)
		}
		return cronSchedule{s: s, expr: expr}, nil
	case interval < 0:
		return nil, fmt.Errorf("backup: interval %v must be positive", interval)
	case interval == 0:
		return nil, errors.New("backup: a schedule needs an interval or a cron expression")
	case interval < time.Second:
		return nil, fmt.Errorf("backup: interval %v is below a second", interval)
	}
	return intervalSchedule(interval), nil
}

// intervalSchedule runs every interval, counting from the newest backup,
// so that restarts neither skip nor repeat one.
type intervalSchedule time.Duration

func (s intervalSchedule) Next(t time.Time) time.Time { return t.Add(time.Duration(s)) }

func (s intervalSchedule) First(now, last time.Time) time.Time {
	if last.IsZero() {
		return now
	}
	if next := last.Add(time.Duration(s)); next.After(now) {
		return next
	}
	return now
}

func (s intervalSchedule) String() string { return "every " + time.Duration(s).String() }

type cronSchedule struct {
	s    cron.Schedule
	expr string
}

func (s cronSchedule) Next(t time.Time) time.Time { return s.s.Next(t.UTC()) }

// First is the next time the expression names: a missed run is not made
// up at start.
func (s cronSchedule) First(now, _ time.Time) time.Time { return s.Next(now) }

func (s cronSchedule) String() string { return "cron " + s.expr }
