// Command grafanaquery evaluates dashboard panel queries through Grafana's own Prometheus datasource backend,
// github.com/grafana/grafana/pkg/promlib: the code a Grafana server runs behind POST /api/ds/query for a Prometheus
// datasource (query model parsing, step and interval calculation, the HTTP call, the response as data frames).
// The tests use it because no Grafana server can be built here (docs: deploy/README.md).
//
// stdin:  {"url": PROMETHEUS_URL, "jsonData": {...}, "from": MS, "to": MS, "queries": [QUERY_MODEL, ...]}: the
// datasource as provisioned, and the body Grafana's frontend sends to /api/ds/query for one panel (each query
// model as in the dashboard JSON, plus intervalMs and maxDataPoints)
// stdout: {"REFID": {"error": "...", "frames": N, "series": N, "points": N}, ...}
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/grafana/grafana-plugin-sdk-go/backend"
	"github.com/grafana/grafana-plugin-sdk-go/backend/log"
	"github.com/grafana/grafana-plugin-sdk-go/data"

	"github.com/grafana/grafana/pkg/promlib"
)

type request struct {
	URL      string            `json:"url"`
	JSONData json.RawMessage   `json:"jsonData"`
	From     int64             `json:"from"`
	To       int64             `json:"to"`
	Queries  []json.RawMessage `json:"queries"`
}

type model struct {
	RefID         string `json:"refId"`
	IntervalMs    int64  `json:"intervalMs"`
	MaxDataPoints int64  `json:"maxDataPoints"`
}

type result struct {
	Error  string `json:"error,omitempty"`
	Frames int    `json:"frames"`
	Series int    `json:"series"`
	Points int    `json:"points"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "grafanaquery:", err)
		os.Exit(1)
	}
}

func run() error {
	var req request
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		return fmt.Errorf("request: %w", err)
	}
	settings := &backend.DataSourceInstanceSettings{
		UID: "prometheus", Name: "Prometheus", Type: "prometheus", URL: req.URL,
		JSONData: req.JSONData, Updated: time.Now(),
	}
	if len(settings.JSONData) == 0 {
		settings.JSONData = []byte(`{}`)
	}
	query := &backend.QueryDataRequest{PluginContext: backend.PluginContext{OrgID: 1, DataSourceInstanceSettings: settings}}
	span := backend.TimeRange{From: time.UnixMilli(req.From), To: time.UnixMilli(req.To)}
	for _, raw := range req.Queries {
		var m model
		if err := json.Unmarshal(raw, &m); err != nil {
			return fmt.Errorf("query model: %w", err)
		}
		query.Queries = append(query.Queries, backend.DataQuery{
			RefID: m.RefID, JSON: raw, TimeRange: span, MaxDataPoints: m.MaxDataPoints,
			Interval: time.Duration(m.IntervalMs) * time.Millisecond, QueryType: "",
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	service := promlib.NewService(nil, log.New(), nil)
	resp, err := service.QueryData(ctx, query)
	if err != nil {
		return err
	}
	out := map[string]result{}
	for ref, r := range resp.Responses {
		res := result{Frames: len(r.Frames)}
		if r.Error != nil {
			res.Error = r.Error.Error()
		}
		for _, frame := range r.Frames {
			if n, _ := frame.RowLen(); n > 0 {
				res.Series += countValueFields(frame)
				res.Points += n * countValueFields(frame)
			}
		}
		out[ref] = res
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

// countValueFields: the series a frame holds (its numeric fields; the time field is not a series).
func countValueFields(frame *data.Frame) int {
	n := 0
	for _, f := range frame.Fields {
		if f.Type() != data.FieldTypeTime && f.Type() != data.FieldTypeNullableTime {
			n++
		}
	}
	return n
}
