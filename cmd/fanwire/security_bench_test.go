package main

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker/brokertest"
)

// BenchmarkAliasStormProcess sends the review's GraphQL alias storm (4,000
// fields under one alias, 160 KB, POST; 1,500 in a GET's query string),
// anonymously, to a `fanwire ws` process over a NATS process, and reports
// the time to the answer and how far the gateway's RSS grew over the run.
//
//	go test -run '^$' -bench BenchmarkAliasStormProcess -benchtime 200x -count 5 ./cmd/fanwire
func BenchmarkAliasStormProcess(b *testing.B) {
	bin := buildBinary(b)
	natsURL := brokertest.NATSBinary(b, brokertest.DebianNATS)
	n := startSecNode(b, bin, "--broker", "nats", "--nats-url", natsURL, "--allow-anonymous")
	post, _ := json.Marshal(map[string]string{"query": aliasStorm(4000)})
	get := "http://" + n.addr + "/graphql?query=" + url.QueryEscape(aliasStorm(1500))
	client := &http.Client{Timeout: 60 * time.Second}
	send := func(method, u string, body string, refused bool) {
		req, err := http.NewRequest(method, u, strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		var out struct {
			Errors []json.RawMessage `json:"errors"`
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if err != nil || refused != (len(out.Errors) > 0) {
			b.Fatalf("%s: %s, %v, %d errors", method, resp.Status, err, len(out.Errors))
		}
	}
	send(http.MethodPost, "http://"+n.addr+"/graphql", `{"query":"{ health { status } }"}`, false)
	before := n.rss(b)
	b.ResetTimer()
	var postTime, getTime time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		send(http.MethodPost, "http://"+n.addr+"/graphql", string(post), true)
		postTime += time.Since(start)
		start = time.Now()
		send(http.MethodGet, get, "", true)
		getTime += time.Since(start)
	}
	b.StopTimer()
	b.ReportMetric(float64(postTime.Microseconds())/1000/float64(b.N), "post-ms/answer")
	b.ReportMetric(float64(getTime.Microseconds())/1000/float64(b.N), "get-ms/answer")
	b.ReportMetric(float64(n.rss(b)-before)/(1<<20), "rss-growth-MiB")
}
