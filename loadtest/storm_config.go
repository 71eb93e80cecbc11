package loadtest

import "fmt"

// storm reports whether the run is a reconnect storm (Config.StormURL).
func (c *Config) storm() bool { return c.StormURL != "" }

// setStormDefaults fills the storm fields of a Config with StormURL set.
// Called by setDefaults only, after Events has its default.
func (c *Config) setStormDefaults() {
	if c.StormAfter == 0 {
		c.StormAfter = max(1, c.Events/4)
	}
	if c.StormSeed == 0 {
		c.StormSeed = randomSeed()
	}
}

// validateStorm checks the storm fields after setDefaults.
func (c *Config) validateStorm() error {
	if !c.storm() {
		if c.StormAfter != 0 || c.StormStop != nil {
			return fmt.Errorf("%w: StormAfter and StormStop need StormURL", ErrInvalidConfig)
		}
		return nil
	}
	switch {
	case c.StormStop == nil:
		return fmt.Errorf("%w: StormStop is required with StormURL: it stops node A", ErrInvalidConfig)
	case c.Broker != "jetstream" && c.Broker != "redis":
		return fmt.Errorf("%w: StormURL needs a durable broker (Broker jetstream or redis), not %q: clients resume on node B from their cursors",
			ErrInvalidConfig, c.brokerName())
	case c.Proto != ProtoNative:
		return fmt.Errorf("%w: StormURL needs native clients, not Proto %q", ErrInvalidConfig, c.Proto)
	case c.ResumeShare > 0 || c.Churn > 0 || c.PublishVia != PublishViaBroker || c.viewRun():
		return fmt.Errorf("%w: StormURL is a test of its own: not with ResumeShare, Churn, PublishVia or Where", ErrInvalidConfig)
	case c.StormAfter < 1 || c.StormAfter >= c.Events:
		return fmt.Errorf("%w: StormAfter %d: want 1 to Events-1 (%d), so that events still flow when node A stops",
			ErrInvalidConfig, c.StormAfter, c.Events-1)
	case c.StormURL == c.URL:
		return fmt.Errorf("%w: StormURL is URL %q: node B must be another node", ErrInvalidConfig, c.URL)
	}
	return checkWSURL("StormURL", c.StormURL)
}
