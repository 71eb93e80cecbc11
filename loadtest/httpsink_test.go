package loadtest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/gatewaytest"
)

// TestRunPublishBatchThroughGateway publishes through the gateway's POST
// /api/publish in requests of 5 events (PublishBatch), paced and in a
// burst, with an event count that leaves a short last request: every
// client gets every event once, in order.
func TestRunPublishBatchThroughGateway(t *testing.T) {
	for _, rate := range []int{0, 2000} {
		t.Run("rate="+map[bool]string{true: "burst", false: "paced"}[rate == 0], func(t *testing.T) {
			natsURL, b := startNATSBroker(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			wsURL := gatewaytest.Start(t, gateway.Config{Broker: b, AllowAnonymousPublish: true}).WSURL()
			res, err := Run(ctx, Config{URL: wsURL, NATSURL: natsURL, PublishBatch: 5, Rate: rate, Clients: 4, Events: 203, Size: 100})
			if err != nil {
				t.Fatal(err)
			}
			if !res.OK() || res.Delivered != 4*203 {
				var table strings.Builder
				res.WriteTable(&table)
				t.Fatalf("run not clean:\n%s", table.String())
			}
		})
	}
	if _, err := Run(context.Background(), Config{URL: "ws://127.0.0.1:1/ws", NATSURL: "nats://127.0.0.1:1", PublishBatch: 5, PublishVia: PublishViaWS}); err == nil || !strings.Contains(err.Error(), "PublishBatch") {
		t.Fatalf("PublishBatch with PublishVia ws: err = %v", err)
	}
}
