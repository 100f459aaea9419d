package backup

import (
	"testing"
	"time"
)

func TestParseSchedule(t *testing.T) {
	at := time.Date(2026, 7, 25, 10, 17, 30, 0, time.UTC)
	for _, tc := range []struct {
		name     string
		interval time.Duration
		cron     string
		wantErr  bool
		next     time.Time
	}{
		{name: "interval", interval: 6 * time.Hour, next: at.Add(6 * time.Hour)},
		{name: "daily at 02:30", cron: "30 2 * * *", next: time.Date(2026, 7, 26, 2, 30, 0, 0, time.UTC)},
		{name: "descriptor", cron: "@hourly", next: time.Date(2026, 7, 25, 11, 0, 0, 0, time.UTC)},
		{name: "every", cron: "@every 90m", next: at.Add(90 * time.Minute)},
		{name: "time zone", cron: "CRON_TZ=Europe/Paris 0 3 * * *", next: time.Date(2026, 7, 26, 1, 0, 0, 0, time.UTC)},
		{name: "both", interval: time.Hour, cron: "@daily", wantErr: true},
		{name: "neither", wantErr: true},
		{name: "negative", interval: -time.Hour, wantErr: true},
		{name: "below a second", interval: time.Millisecond, wantErr: true},
		{name: "bad cron", cron: "61 * * * *", wantErr: true},
		{name: "six fields", cron: "0 0 2 * * *", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := ParseSchedule(tc.interval, tc.cron)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("parsed as %v", s)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := s.Next(at); !got.Equal(tc.next) {
				t.Fatalf("next after %v: %v, want %v", at, got, tc.next)
			}
		})
	}
}

func TestScheduleFirstRun(t *testing.T) {
	now := time.Date(2026, 7, 25, 10, 0, 0, 0, time.UTC)
	every, err := ParseSchedule(6*time.Hour, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		last time.Time
		want time.Time
	}{
		{"no backup yet: now", time.Time{}, now},
		{"a recent one: its time plus the interval", now.Add(-time.Hour), now.Add(5 * time.Hour)},
		{"overdue: now", now.Add(-7 * time.Hour), now},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := every.First(now, tc.last); !got.Equal(tc.want) {
				t.Fatalf("first %v, want %v", got, tc.want)
			}
		})
	}
	daily, err := ParseSchedule(0, "0 2 * * *")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := daily.First(now, now.Add(-48*time.Hour)), time.Date(2026, 7, 26, 2, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Fatalf("cron first %v, want %v (a missed run is not made up)", got, want)
	}
}

func TestConfigSchedule(t *testing.T) {
	c := Config{Interval: DefaultInterval, Cron: "@daily", HoldTTL: DefaultHoldTTL, Concurrency: 1, Listen: DefaultListen}
	s, err := c.Schedule()
	if err != nil || s.String() != "cron @daily" {
		t.Fatalf("cron replaces the default interval: %v, %v", s, err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(c *Config)
	}{
		{"public listener", func(c *Config) { c.Listen = "0.0.0.0:4436" }},
		{"listener without host", func(c *Config) { c.Listen = ":4436" }},
		{"short hold", func(c *Config) { c.HoldTTL = time.Second }},
		{"no concurrency", func(c *Config) { c.Concurrency = 0 }},
		{"negative retention", func(c *Config) { c.KeepLast = -1 }},
		{"bad cron", func(c *Config) { c.Cron = "every day" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := c
			tc.edit(&bad)
			if err := bad.Validate(); err == nil {
				t.Fatal("valid")
			}
		})
	}
	for _, ok := range []string{"127.0.0.1:0", "[::1]:4436", "localhost:4436", ""} {
		good := c
		good.Listen = ok
		if err := good.Validate(); err != nil {
			t.Fatalf("listen %q: %v", ok, err)
		}
	}
}
