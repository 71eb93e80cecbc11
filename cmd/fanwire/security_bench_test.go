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
	// send asks and checks that the answer is GraphQL errors (refused)
	// or none.
	send := func(req *http.Request, refused bool) {
		code, body := secDo(b, req)
		var out struct {
			Errors []json.RawMessage `json:"errors"`
		}
		if err := json.Unmarshal([]byte(body), &out); err != nil || refused != (len(out.Errors) > 0) {
			b.Fatalf("%s: %d %.200s", req.Method, code, body)
		}
	}
	request := func(method, u, body string) *http.Request {
		req, err := http.NewRequest(method, u, strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		return req
	}
	send(request(http.MethodPost, "http://"+n.addr+"/graphql", `{"query":"{ health { status } }"}`), false)
	before := n.rss(b)
	b.ResetTimer()
	var postTime, getTime time.Duration
	for i := 0; i < b.N; i++ {
		start := time.Now()
		send(request(http.MethodPost, "http://"+n.addr+"/graphql", string(post)), true)
		postTime += time.Since(start)
		start = time.Now()
		send(request(http.MethodGet, get, ""), true)
		getTime += time.Since(start)
	}
	b.StopTimer()
	b.ReportMetric(float64(postTime.Microseconds())/1000/float64(b.N), "post-ms/answer")
	b.ReportMetric(float64(getTime.Microseconds())/1000/float64(b.N), "get-ms/answer")
	b.ReportMetric(float64(n.rss(b)-before)/(1<<20), "rss-growth-MiB")
}
