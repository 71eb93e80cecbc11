package loadtest

import (
	"fmt"
	"net/url"
	"time"
)

// setChurnDefaults fills the churn fields of a Config with Churn > 0, and
// Events from the schedule. Called by setDefaults only.
func (c *Config) setChurnDefaults() {
	if c.ChurnClients == 0 {
		c.ChurnClients = DefaultChurnClients
	}
	if c.Rate == 0 {
		c.Rate = DefaultChurnRate
	}
	if c.ChurnBaseline == 0 {
		c.ChurnBaseline = DefaultChurnBaseline
	}
	if c.ChurnSettle == 0 {
		c.ChurnSettle = max(DefaultChurnSettle, c.ChurnBaseline)
	}
	if c.Events == 0 {
		c.Events = c.churnEvents()
	}
	if c.MetricsURL == "" && c.URL != "" {
		c.MetricsURL, _ = metricsURL(c.URL) // validate reports a URL it cannot derive from
	}
	if c.ChurnSeed == 0 {
		c.ChurnSeed = randomSeed()
	}
}

// churnSpan is how long events flow in a churn run.
func (c *Config) churnSpan() time.Duration { return c.ChurnBaseline + c.Churn + c.ChurnSettle }

// churnEvents is how many events Rate publishes over churnSpan.
func (c *Config) churnEvents() int {
	return int(float64(c.Rate) * c.churnSpan().Seconds())
}

// churnWindow is how long the baseline and the after figures are read
// over: the second half of ChurnBaseline (the Clients' writers are busy by
// then), and the same length at the end of ChurnSettle.
func (c *Config) churnWindow() time.Duration { return c.ChurnBaseline / 2 }

// validateChurn checks the churn fields after setDefaults.
func (c *Config) validateChurn() error {
	switch {
	case c.Churn < 0:
		return fmt.Errorf("%w: Churn %v is negative", ErrInvalidConfig, c.Churn)
	case c.Churn == 0:
		return nil
	case c.ChurnClients < 0:
		return fmt.Errorf("%w: ChurnClients %d is negative", ErrInvalidConfig, c.ChurnClients)
	case c.ChurnBaseline < time.Second:
		return fmt.Errorf("%w: ChurnBaseline %v: want at least 1s", ErrInvalidConfig, c.ChurnBaseline)
	case c.ChurnSettle < c.ChurnBaseline:
		return fmt.Errorf("%w: ChurnSettle %v is shorter than ChurnBaseline %v: the after figures are read over as long a window as the baseline",
			ErrInvalidConfig, c.ChurnSettle, c.ChurnBaseline)
	case c.Events != c.churnEvents():
		return fmt.Errorf("%w: Events %d with Churn: leave it 0, it is Rate × (ChurnBaseline + Churn + ChurnSettle) = %d",
			ErrInvalidConfig, c.Events, c.churnEvents())
	case c.ResumeShare > 0:
		return fmt.Errorf("%w: ResumeShare with Churn: run them separately", ErrInvalidConfig)
	case c.MetricsURL == "":
		_, err := metricsURL(c.URL)
		return fmt.Errorf("%w: no MetricsURL from URL %q: %w", ErrInvalidConfig, c.URL, err)
	}
	u, err := url.Parse(c.MetricsURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("%w: MetricsURL %q: want an http(s) URL", ErrInvalidConfig, c.MetricsURL)
	}
	return nil
}
